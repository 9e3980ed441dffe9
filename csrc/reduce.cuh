// The reductions after the GEMMs: the SiLU of split-K gate/up partial sums, and each token's sum over its top-k
// slots (which also adds split-K partial sums of GEMM 2). Grid-stride loops of ELEMENTWISE_THREADS-thread blocks;
// the fused decode kernel (decode_fused.cuh) runs the same per-element sums inside its blocks.
#pragma once

#include "config.cuh"
#include "epilogue.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace samoyeds {

// SiLU(sum_z gate[z, pos, i]) * sum_z up[z, pos, i]: one activation from the split-K shares of gate/up, summed in
// a fixed order. Loads bypass L1 (ld.cg): the fused decode kernel reads shares other blocks of it just wrote.
__device__ __forceinline__ float gate_up_from_shares(const MoEParams& p, size_t pos, int i) {
  float gate = 0.0f, up = 0.0f;
  for (int z = 0; z < p.gate_up_splits; ++z) {
    const float* row = p.gate_up_partial + ((size_t)z * p.slots + pos) * 2 * p.inter;
    gate += __ldcg(row + i);
    up += __ldcg(row + p.inter + i);
  }
  return silu(gate) * up;
}

// act[pos, i] from the split-K shares, after GEMM 1.
template <typename T>
__global__ void silu_mul_splits(const __grid_constant__ MoEParams p) {
  T* __restrict__ act = static_cast<T*>(p.act);
  const int inter = p.inter;
  const size_t n = (size_t)p.slots * inter;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x)
    act[idx] = from_float<T>(gate_up_from_shares(p, idx / inter, idx % inter));
}

// VEC consecutive elements as floats (ld.cg, as above), and back: one 16-byte access per 16 bytes for VEC > 1.
template <int VEC, typename S>
__device__ __forceinline__ void load_vec(const S* p, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = (float)__ldcg(p);
  } else {
    alignas(16) S raw[VEC];
#pragma unroll
    for (int q = 0; q < VEC * (int)sizeof(S) / 16; ++q)
      reinterpret_cast<uint4*>(raw)[q] = __ldcg(reinterpret_cast<const uint4*>(p) + q);
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

// total += src[z, token * top_k + j, h .. h + VEC) over the token's slots routed to an expert of this rank and every
// split-K share, in a fixed order (deterministic). SRC is T (no split) or float (split-K partials).
template <typename SRC, int VEC>
__device__ __forceinline__ void add_token_slots(const MoEParams& p, size_t token, size_t h, float (&total)[VEC]) {
  const SRC* src = static_cast<const SRC*>(p.y);
  const int top_k = p.top_k;
  const size_t slots = (size_t)p.tokens * top_k;
  float part[VEC];
  for (int j = 0; j < top_k; ++j) {
    const long long e = p.topk_ids[token * top_k + j];
    if (e < 0 || e >= p.num_experts) continue;
    for (int z = 0; z < p.down_splits; ++z) {
      load_vec(src + ((size_t)z * slots + token * top_k + j) * p.hidden + h, part);
#pragma unroll
      for (int q = 0; q < VEC; ++q) total[q] += part[q];
    }
  }
}

// out[t, h] = each token's sum over its top-k slots (add_token_slots). Each thread sums VEC consecutive h: 8
// (16-byte accesses) for large batches, where this is a stream of T * top_k * H values; 1 for decode, where it is
// latency-bound and more threads do better (kernels/plan.py picks; hidden is a multiple of 64).
template <typename T, typename SRC, int VEC>
__global__ void sum_slots(const __grid_constant__ MoEParams p) {
  T* __restrict__ out = static_cast<T*>(p.out);
  const int hidden = p.hidden;
  const size_t n = (size_t)p.tokens * hidden / VEC;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
    float total[VEC] = {};
    add_token_slots<SRC>(p, idx * VEC / hidden, idx * VEC % hidden, total);
    store_vec(out + idx * VEC, total);
  }
}

}  // namespace samoyeds
