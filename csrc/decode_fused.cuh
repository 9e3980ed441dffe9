// The fused decode path: one persistent kernel runs both expert GEMMs of a small batch and finishes them itself,
// right after build_routing_index (which also zeroed its counters). At decode the layer streams weights and its
// separate kernels were mostly fixed costs: GEMM 1, the split-K SiLU, GEMM 2 and the slot sum each waited for the
// one before to drain, and GEMM 2 could not start reading its weights before GEMM 1 was done.
//
// Work items, taken in index order (the first wave by blockIdx.x, the rest from a ticket counter):
//   gate/up items (tile, row block, k share), then down items (tile, row block, k share),
// each the work of one block of the separate kernels (moe_gemm_body with FUSED_WARPS warps, mma.sp).
// - A gate/up item writes its activations (or its fp32 share); under split-K the last share of a (tile, row block)
//   to arrive sums the shares and writes SiLU(gate) * up in the order silu_mul_splits uses. The tile's ready
//   counter then counts the row block.
// - A down item issues its first stages' weight copies, then waits until every gate/up row block of its tile is
//   ready, then reads the activations. The last (slot, share) piece of a (token, row block) to arrive sums the
//   token's slots over that row block, in the order sum_slots uses: the output is bit for bit the separate
//   kernels' output.
// No deadlock: a down item waits only for gate/up items, which have lower indices, so they were handed to blocks
// already running (blocks are dispatched in index order, tickets handed out in order) that wait for nothing.
#pragma once

#include "config.cuh"
#include "gemm_mma.cuh"
#include "operands.cuh"
#include "params.cuh"
#include "ptx.cuh"
#include "reduce.cuh"

namespace samoyeds {

// Where the counters live in MoEParams.counters (kernels/plan.py sizes it: fused_counter_count).
struct FusedCounters {
  int* ticket;            // [1] work items handed out past the first wave
  int* gate_up_arrivals;  // [num_tiles, gate/up row blocks] k shares of gate/up written
  int* tile_ready;        // [num_tiles] gate/up row blocks whose activations are written
  int* token_arrivals;    // [tokens, down row blocks] (slot, k share) pieces of GEMM 2 written
  __device__ __forceinline__ FusedCounters(const MoEParams& p, int gate_up_row_blocks) {
    ticket = p.counters;
    gate_up_arrivals = ticket + 1;
    tile_ready = gate_up_arrivals + p.num_tiles * gate_up_row_blocks;
    token_arrivals = tile_ready + p.num_tiles;
  }
};

// Publishes this block's global writes with one release add (after every thread's writes).
__device__ __forceinline__ void block_release_add(int* counter) {
  __syncthreads();
  if (threadIdx.x == 0) red_add_release_gpu(counter, 1);
}

template <typename T, bool FP8, bool SAMOYEDS, int V, int BN>
__global__ void __launch_bounds__(FUSED_WARPS * 32) moe_decode_fused(const __grid_constant__ MoEParams p) {
  constexpr int WARPS = FUSED_WARPS, BM = WARPS * SLAB_ROWS;  // condensed rows per item, per half for gate/up
  constexpr int OUT_PER_ROW = SAMOYEDS ? 2 : 1;               // output rows per condensed row
  using Value = typename ValueOf<T, FP8>::type;
  const GemmOperands<T, true> gate_up{p};
  const GemmOperands<T, false> down{p};
  const int rb1 = gate_up.R() / 2 / BM, rb2 = down.R() / BM;
  const int z1 = p.gate_up_splits, z2 = p.down_splits;
  const int items1 = p.num_tiles * rb1 * z1, items = items1 + p.num_tiles * rb2 * z2;
  const FusedCounters counters(p, rb1);
  const int tid = threadIdx.x;
  __shared__ int next_item, is_last, n_finished, finished_tokens[BN];

  for (int item = blockIdx.x; item < items;) {
    if (item < items1) {
      const int tile = item / (rb1 * z1), rb = item / z1 % rb1, z = item % z1;
      const int n_rows = p.tile_rows[tile];
      if (n_rows > 0) {
        moe_gemm_body<T, FP8, SAMOYEDS, V, BN, true, WARPS, 2, false>(
            gate_up.x(), gate_up.template values<Value>(), gate_up.meta(), gate_up.rowsel(), gate_up.scale(),
            gate_up.out(), gate_up.partial(), p.tile_expert, p.tile_start, p.tile_rows, p.sorted_slot,
            p.topk_weights, gate_up.R(), gate_up.K(), p.top_k, gate_up.N_out(), p.slots, tile, rb, Split{z, z1},
            [] {});
        bool ready = true;
        if (z1 > 1) {  // the last k share of (tile, row block) to arrive finishes SiLU(gate) * up
          __threadfence();
          __syncthreads();
          if (tid == 0) is_last = atom_add_acq_rel_gpu(&counters.gate_up_arrivals[tile * rb1 + rb], 1) == z1 - 1;
          __syncthreads();
          ready = is_last;
          if (ready) {
            const int first = p.tile_start[tile], cols = BM * OUT_PER_ROW, col0 = rb * cols;
            T* act = static_cast<T*>(p.act);
            for (int idx = tid; idx < n_rows * cols; idx += blockDim.x) {
              const size_t pos = first + idx / cols;
              const int i = col0 + idx % cols;
              act[pos * p.inter + i] = from_float<T>(gate_up_from_shares(p, pos, i));
            }
            __threadfence();
          }
        }
        if (ready) block_release_add(&counters.tile_ready[tile]);
      }
    } else {
      const int d = item - items1;
      const int tile = d / (rb2 * z2), rb = d / z2 % rb2, z = d % z2;
      const int n_rows = p.tile_rows[tile];
      if (n_rows > 0) {
        moe_gemm_body<T, FP8, SAMOYEDS, V, BN, false, WARPS, 1, false>(
            down.x(), down.template values<Value>(), down.meta(), down.rowsel(), down.scale(), down.out(),
            down.partial(), p.tile_expert, p.tile_start, p.tile_rows, p.sorted_slot, p.topk_weights, down.R(),
            down.K(), p.top_k, down.N_out(), p.slots, tile, rb, Split{z, z2}, [&] {
              if (tid == 0)
                while (ld_acquire_gpu(&counters.tile_ready[tile]) < rb1) __nanosleep(32);
              __syncthreads();
            });
        // Each token of the tile whose last piece of this row block this was sums its slots over the row block.
        __threadfence();
        if (tid == 0) n_finished = 0;
        __syncthreads();
        if (tid < n_rows) {
          const long long token = p.sorted_slot[p.tile_start[tile] + tid] / p.top_k;
          int pieces = 0;
          for (int j = 0; j < p.top_k; ++j) {
            const long long e = p.topk_ids[token * p.top_k + j];
            pieces += e >= 0 && e < p.num_experts;
          }
          if (atom_add_acq_rel_gpu(&counters.token_arrivals[token * rb2 + rb], 1) == pieces * z2 - 1)
            finished_tokens[atomicAdd(&n_finished, 1)] = (int)token;
        }
        __syncthreads();
        T* out = static_cast<T*>(p.out);
        const int rows = BM * OUT_PER_ROW, row0 = rb * rows;
        for (int idx = tid; idx < n_finished * rows; idx += blockDim.x) {
          const size_t token = finished_tokens[idx / rows], h = row0 + idx % rows;
          float total[1] = {};
          if (z2 > 1) add_token_slots<float>(p, token, h, total);
          else add_token_slots<T>(p, token, h, total);
          out[token * p.hidden + h] = from_float<T>(total[0]);
        }
      }
    }
    __syncthreads();  // the item's shared memory is free, and next_item may be written
    if (tid == 0) next_item = gridDim.x + atomicAdd(counters.ticket, 1);
    __syncthreads();
    item = next_item;
  }
}

}  // namespace samoyeds
