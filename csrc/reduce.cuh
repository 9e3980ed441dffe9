// The reductions after the GEMMs: the SiLU of split-K gate/up partial sums, and each token's sum over its top-k
// slots (which also adds split-K partial sums of GEMM 2). Grid-stride loops of ELEMENTWISE_THREADS-thread blocks.
#pragma once

#include "config.cuh"
#include "epilogue.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace samoyeds {

// act[pos, i] = SiLU(sum_z gate[z, pos, i]) * sum_z up[z, pos, i], the partials added in z order. A thread loads
// every split's pair before adding any: at decode this kernel is a few round trips to L2, and a loop with an add
// after each load waited for them one split at a time.
template <typename T>
__global__ void silu_mul_splits(const __grid_constant__ MoEParams p) {
  grid_dependency_wait();
  const float* __restrict__ partial = p.gate_up_partial;
  T* __restrict__ act = static_cast<T*>(p.act);
  const int splits = p.gate_up_splits, slots = p.slots, inter = p.inter;
  const size_t n = (size_t)slots * inter;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
    const size_t pos = idx / inter, i = idx % inter;
    float gates[MAX_SPLITS], ups[MAX_SPLITS];
#pragma unroll
    for (int z = 0; z < MAX_SPLITS; ++z) {
      if (z < splits) {
        const float* row = partial + ((size_t)z * slots + pos) * 2 * inter;
        gates[z] = row[i];
        ups[z] = row[inter + i];
      }
    }
    float gate = 0.0f, up = 0.0f;
#pragma unroll
    for (int z = 0; z < MAX_SPLITS; ++z) {
      if (z < splits) {
        gate += gates[z];
        up += ups[z];
      }
    }
    act[idx] = from_float<T>(silu(gate) * up);
  }
}

// VEC consecutive elements as floats, and back: one access of VEC * sizeof(S) bytes (4 or 8), or 16-byte accesses
// from 16 bytes up.
template <int BYTES> struct Chunk;  // an unsigned type of BYTES bytes, for one load or store of that width
template <> struct Chunk<4> { using type = unsigned int; };
template <> struct Chunk<8> { using type = uint2; };

template <int VEC, typename S>
__device__ __forceinline__ void load_vec(const S* p, float (&v)[VEC]) {
  constexpr int BYTES = VEC * (int)sizeof(S);
  if constexpr (VEC == 1) {
    v[0] = (float)p[0];
  } else {
    alignas(16) S raw[VEC];
    if constexpr (BYTES < 16) {
      using C = typename Chunk<BYTES>::type;
      *reinterpret_cast<C*>(raw) = *reinterpret_cast<const C*>(p);
    } else {
#pragma unroll
      for (int q = 0; q < BYTES / 16; ++q) reinterpret_cast<uint4*>(raw)[q] = reinterpret_cast<const uint4*>(p)[q];
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = (float)raw[i];
  }
}

template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[VEC]) {
  constexpr int BYTES = VEC * (int)sizeof(T);
  if constexpr (VEC == 1) {
    p[0] = from_float<T>(v[0]);
  } else {
    alignas(16) T packed[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) packed[i] = from_float<T>(v[i]);
    static_assert(BYTES <= 16, "one store of at most 16 bytes: outputs are bf16 / fp16, at most SUM_VEC of them");
    if constexpr (BYTES < 16) {
      using C = typename Chunk<BYTES>::type;
      *reinterpret_cast<C*>(p) = *reinterpret_cast<const C*>(packed);
    } else {
      *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(packed);
    }
  }
}

// out[t, h] = sum_j sum_z src[z, t * top_k + j, h] over the slots routed to an expert of this rank, added in a fixed
// order (j outer, z inner: deterministic). SRC is T (no split) or float (split-K partials). Each thread sums VEC
// consecutive h: 8 (16-byte accesses) for large batches, where this is a stream of T * top_k * H values; 1 for
// decode, where it is latency-bound and more threads do better; 2 between, where one wave of scalar threads would
// take more than one pass and each warp's scalar loads of 64 bytes fill half a 128-byte line (kernels/plan.py
// picks; hidden is a multiple of 64, so pairs stay aligned). Without split-K a thread of 1 or 2 elements issues the
// loads of SUM_SLOTS_IN_FLIGHT slots (a token's top-k, for k up to 8) before adding any: one round trip to L2
// instead of one per slot, which a loop with an add after each load paid (H100, Qwen3 shape, µs of the layer: 20.7
// -> 19.0 at T = 1, 187.5 -> 177.8 at T = 512). Split-K partials keep that loop, whose split loop the compiler
// unrolls on its own (32 registers): every form with slots or splits in flight by hand took 36-46 registers, fewer
// blocks per SM, and made Mixtral's T = 256 (top-2, down projection split four ways) 1-4% slower. 16-byte vectors
// keep it too (eight slots took 160-170 registers).
template <typename T, typename SRC, int VEC>
__global__ void sum_slots(const __grid_constant__ MoEParams p) {
  grid_dependency_wait();
  constexpr bool PARTIALS = sizeof(SRC) == 4;  // fp32 split-K partials, not T
  constexpr int U = VEC <= 2 && !PARTIALS ? SUM_SLOTS_IN_FLIGHT : 1;
  const SRC* __restrict__ src = static_cast<const SRC*>(p.y);
  const long long* __restrict__ topk_ids = p.topk_ids;
  T* __restrict__ out = static_cast<T*>(p.out);
  const int E = p.num_experts, splits = p.down_splits, tokens = p.tokens, top_k = p.top_k, hidden = p.hidden;
  const size_t n = (size_t)tokens * hidden / VEC, slots = (size_t)tokens * top_k;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
    const size_t token = idx * VEC / hidden, h = idx * VEC % hidden;
    float total[VEC] = {};
    if constexpr (U == 1) {
      float part[VEC];
      for (int j = 0; j < top_k; ++j) {
        const long long e = topk_ids[token * top_k + j];
        if (e < 0 || e >= E) continue;
        for (int z = 0; z < splits; ++z) {
          load_vec(src + ((size_t)z * slots + token * top_k + j) * hidden + h, part);
#pragma unroll
          for (int q = 0; q < VEC; ++q) total[q] += part[q];
        }
      }
    } else {  // no split-K: splits == 1
      // Each slot's row is loaded beside its expert id, not after it: every slot has a row in src (another rank's
      // slot an unwritten one, read and left out of the sum, so even NaN there stays out), and the token's
      // loads cost one round trip instead of two (the ids', then the rows').
      for (int j0 = 0; j0 < top_k; j0 += U) {
        bool kept[U];
        float part[U][VEC];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const bool slot = j0 + u < top_k;
          // (the id's low word: ids are below 2^31, -1 stays -1, and half the registers wait on the load)
          const int e = slot ? reinterpret_cast<const int*>(topk_ids)[2 * (token * top_k + j0 + u)] : -1;
          if (slot) load_vec(src + (token * top_k + j0 + u) * hidden + h, part[u]);
          kept[u] = e >= 0 && e < E;
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (kept[u])
#pragma unroll
            for (int q = 0; q < VEC; ++q) total[q] += part[u][q];
      }
    }
    store_vec(out + idx * VEC, total);
  }
}

}  // namespace samoyeds
