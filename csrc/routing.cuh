// The routing index: before the GEMMs, the (token, j) slots sorted by expert and cut into token tiles.
//
// One block (at least one thread per expert, one per slot up to 1024: kernels/plan.py), with two helper kernels
// over many blocks for large batches (below). It counting-sorts the slots by expert and cuts each expert's slots
// into tiles of at most token_tile slots (one map for both GEMMs); unused tiles get rows = 0, so the host sizes
// every grid from the shapes alone, without a host synchronisation. The order of slots inside an expert is
// whatever the atomics give (slot order for a few tokens, whose GEMM 1 works the map out itself: few_tokens.cuh,
// which relies on this file's layout: tiles in expert order, an expert's first tile at its first sorted position):
// every slot's result depends only on its own token and expert, so the layer's output is still bit-for-bit
// deterministic. Slots routed to an expert on another rank (id outside [0, E), expert
// parallelism) get no tile; sum_slots skips them.
#pragma once

#include "config.cuh"
#include "few_tokens.cuh"
#include "params.cuh"

namespace samoyeds {

// Exclusive prefix sum over the block (blockDim.x = 1024): warp shuffles, then a scan of the 32 warp totals.
__device__ int block_exclusive_scan(int value, int* warp_sums, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? warp_sums[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int other = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += other;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  const int result = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - value;
  total = warp_sums[warps - 1];
  __syncthreads();  // warp_sums is reused by the next scan
  return result;
}

// The tile map: expert, first sorted position and slot count of each tile of at most bn slots of one expert,
// experts in order; tiles past the last one get rows = 0. GEMM 1 of a few tokens (few_tokens.cuh) works this map
// out from topk_ids itself and relies on that layout: a change here must change it too.
__device__ void write_tiles(int* tiles, int bn, int num_tiles, const int* counts, int* tile_end, int* warp_sums,
                            const int* first, int E) {
  const int e = threadIdx.x;
  const int expert_tiles = e < E ? (counts[e] + bn - 1) / bn : 0;
  int total;
  const int before = block_exclusive_scan(expert_tiles, warp_sums, total);
  if (e < E) tile_end[e] = before + expert_tiles;
  __syncthreads();
  for (int t = threadIdx.x; t < num_tiles; t += blockDim.x) {
    int lo = 0, hi = E;  // first expert whose tile_end > t
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (tile_end[mid] > t) hi = mid; else lo = mid + 1;
    }
    if (lo < E) {
      const int local = t - (tile_end[lo] - (counts[lo] + bn - 1) / bn);
      const int rows = counts[lo] - local * bn;
      reinterpret_cast<int4*>(tiles)[t] = make_int4(lo, first[lo] + local * bn, rows < bn ? rows : bn, 0);
    } else {
      reinterpret_cast<int4*>(tiles)[t] = make_int4(0, 0, 0, 0);
    }
  }
}

// f(slot, expert) for every slot in [begin, end) routed to this rank's experts, spread over the block with
// ROUTE_ILP loads in flight per thread.
template <typename F>
__device__ void for_each_slot(const long long* __restrict__ topk_ids, int begin, int end, int E, F f) {
  for (int base = begin; base < end; base += blockDim.x * ROUTE_ILP) {
    long long ids[ROUTE_ILP];
#pragma unroll
    for (int u = 0; u < ROUTE_ILP; ++u) {
      const int s = base + u * blockDim.x + threadIdx.x;
      ids[u] = s < end ? topk_ids[s] : -1;
    }
#pragma unroll
    for (int u = 0; u < ROUTE_ILP; ++u)
      if (ids[u] >= 0 && ids[u] < E) f(base + u * blockDim.x + threadIdx.x, (int)ids[u]);
  }
}

// Per-expert slot counts (shared-memory counters) and each slot's sorted position (cursor: the next free
// position of each expert), over the slots [begin, end) a block takes.
__device__ void count_slots_into(const long long* __restrict__ topk_ids, int begin, int end, int E, int* counts) {
  for_each_slot(topk_ids, begin, end, E, [counts](int, int e) { atomicAdd(&counts[e], 1); });
}
__device__ void place_slots(const MoEParams& p, int begin, int end, int* cursor) {
  int* __restrict__ sorted_slot = p.sorted_slot;
  float* __restrict__ sorted_weight = p.sorted_weight;
  const float* __restrict__ weights = p.topk_weights;
  for_each_slot(p.topk_ids, begin, end, p.num_experts, [&](int s, int e) {
    const int pos = atomicAdd(&cursor[e], 1);
    sorted_slot[pos] = s;
    sorted_weight[pos] = weights[s];
  });
}

// Large batches: one block's shared-memory atomics on E counters cap the index at about one slot per clock (ncu,
// H100, 131,072 slots: 144 us), so the counting and the scatter run over many blocks, each taking ROUTE_CHUNK
// slots: count_slots writes each chunk's per-expert counts, build_routing_index turns them into each chunk's first
// sorted position per expert, scatter_slots places the chunk's slots from there.
__global__ void __launch_bounds__(ROUTE_THREADS) count_slots(const __grid_constant__ MoEParams p) {
  grid_dependency_wait();
  __shared__ int counts[MAX_EXPERTS];
  const int E = p.num_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int begin = blockIdx.x * ROUTE_CHUNK, end = min(begin + ROUTE_CHUNK, p.slots);
  count_slots_into(p.topk_ids, begin, end, E, counts);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) p.chunk_counts[(size_t)blockIdx.x * E + e] = counts[e];
}

// chunk_counts holds each chunk's first sorted position per expert by now (build_routing_index wrote them).
__global__ void __launch_bounds__(ROUTE_THREADS) scatter_slots(const __grid_constant__ MoEParams p) {
  grid_dependency_wait();
  __shared__ int cursor[MAX_EXPERTS];
  const int E = p.num_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cursor[e] = p.chunk_counts[(size_t)blockIdx.x * E + e];
  __syncthreads();
  const int begin = blockIdx.x * ROUTE_CHUNK, end = min(begin + ROUTE_CHUNK, p.slots);
  place_slots(p, begin, end, cursor);
}

// chunks = 0: counts and scatters the slots itself (decode and small batches: one launch). chunks > 0: sums the
// chunk counts of count_slots and overwrites them with each chunk's first sorted position per expert, for
// scatter_slots to run next. Then writes the tile map of both GEMMs.
__global__ void __launch_bounds__(1024, 1) build_routing_index(const __grid_constant__ MoEParams p) {
  grid_dependency_wait();
  // The next kernel may start at once: it reads nothing of the index before its own wait (GEMM 1 of a few tokens
  // maps itself: few_tokens.cuh; the FP8 copy of x waits at its end), and this one block leaves the other SMs to it,
  // so the copy of x is made while the index is built.
  allow_dependents();
  __shared__ int counts[MAX_EXPERTS], first[MAX_EXPERTS], cursor[MAX_EXPERTS], tile_end[MAX_EXPERTS];
  __shared__ int warp_sums[32];
  const int E = p.num_experts, chunks = p.chunks;
  int* chunk_counts = p.chunk_counts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int total = 0;
    for (int c = 0; c < chunks; ++c) total += chunk_counts[(size_t)c * E + e];
    counts[e] = total;
  }
  __syncthreads();
  if (chunks == 0) count_slots_into(p.topk_ids, 0, p.slots, E, counts);
  __syncthreads();
  int total;
  const int e = threadIdx.x;
  const int start = block_exclusive_scan(e < E ? counts[e] : 0, warp_sums, total);
  if (e < E) first[e] = cursor[e] = start;
  __syncthreads();
  if (chunks == 0) {
    if (maps_itself(p))
      place_in_slot_order(p, first);
    else
      place_slots(p, 0, p.slots, cursor);
  } else if (e < E) {
    int position = first[e];
    for (int c = 0; c < chunks; ++c) {
      const int n = chunk_counts[(size_t)c * E + e];
      chunk_counts[(size_t)c * E + e] = position;
      position += n;
    }
  }
  write_tiles(p.tiles, p.token_tile, p.num_tiles, counts, tile_end, warp_sums, first, E);
}

}  // namespace samoyeds
