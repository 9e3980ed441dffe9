// The reductions after the GEMMs: the SiLU of split-K gate/up partial sums, and each token's sum over its top-k
// slots (which also adds split-K partial sums of GEMM 2). Grid-stride loops of ELEMENTWISE_THREADS-thread blocks.
#pragma once

#include "config.cuh"
#include "epilogue.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace samoyeds {

// act[pos, i] = SiLU(sum_z gate[z, pos, i]) * sum_z up[z, pos, i]
// act[pos, i] = SiLU(sum_z gate[z, pos, i]) * sum_z up[z, pos, i]
template <typename T>
__global__ void silu_mul_splits(const __grid_constant__ MoEParams p) {
  const float* __restrict__ partial = p.gate_up_partial;
  T* __restrict__ act = static_cast<T*>(p.act);
  const int splits = p.gate_up_splits, slots = p.slots, inter = p.inter;
  const size_t n = (size_t)slots * inter;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
    const size_t pos = idx / inter, i = idx % inter;
    float gate = 0.0f, up = 0.0f;
    for (int z = 0; z < splits; ++z) {
      const float* row = partial + ((size_t)z * slots + pos) * 2 * inter;
      gate += row[i];
      up += row[inter + i];
    }
    act[idx] = from_float<T>(silu(gate) * up);
  }
}

// VEC consecutive elements as floats, and back: one 16-byte access per 16 bytes for VEC > 1.
template <int VEC, typename S>
__device__ __forceinline__ void load_vec(const S* p, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = (float)p[0];
  } else {
    alignas(16) S raw[VEC];
#pragma unroll
    for (int q = 0; q < VEC * (int)sizeof(S) / 16; ++q)
      reinterpret_cast<uint4*>(raw)[q] = reinterpret_cast<const uint4*>(p)[q];
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = (float)raw[i];
  }
}

template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    p[0] = from_float<T>(v[0]);
  } else {
    alignas(16) T packed[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) packed[i] = from_float<T>(v[i]);
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(packed);
  }
}

// out[t, h] = sum_j sum_z src[z, t * top_k + j, h] over the slots routed to an expert of this rank, in a fixed
// order (deterministic). SRC is T (no split) or float (split-K partials). Each thread sums VEC consecutive h:
// 8 (16-byte accesses) for large batches, where this is a stream of T * top_k * H values; 1 for decode, where
// it is latency-bound and more threads do better (kernels/plan.py picks; hidden is a multiple of 64).
template <typename T, typename SRC, int VEC>
__global__ void sum_slots(const __grid_constant__ MoEParams p) {
  const SRC* __restrict__ src = static_cast<const SRC*>(p.y);
  const long long* __restrict__ topk_ids = p.topk_ids;
  T* __restrict__ out = static_cast<T*>(p.out);
  const int E = p.num_experts, splits = p.down_splits, tokens = p.tokens, top_k = p.top_k, hidden = p.hidden;
  const size_t n = (size_t)tokens * hidden / VEC, slots = (size_t)tokens * top_k;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
    const size_t token = idx * VEC / hidden, h = idx * VEC % hidden;
    float total[VEC] = {}, part[VEC];
    for (int j = 0; j < top_k; ++j) {
      const long long e = topk_ids[token * top_k + j];
      if (e < 0 || e >= E) continue;
      for (int z = 0; z < splits; ++z) {
        load_vec(src + ((size_t)z * slots + token * top_k + j) * hidden + h, part);
#pragma unroll
        for (int q = 0; q < VEC; ++q) total[q] += part[q];
      }
    }
    store_vec(out + idx * VEC, total);
  }
}

}  // namespace samoyeds
