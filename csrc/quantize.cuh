// FP8 activations: the rows a GEMM reads as its B operand turned into float8 e4m3 bytes with one fp32 scale per row
// (scale = the row's largest magnitude / 448, e4m3's largest value), before the GEMM that reads them
// (gemm_ws.cuh with ACT8). GATE_UP: x [tokens, hidden] -> x_fp8, x_scale; else act [slots, inter] -> act_fp8,
// act_scale. One scale per row, so the GEMM applies it once per output column in its epilogue; a scale per
// 128-input group (DeepSeek-V3's) would be applied per k tile inside the k loop, in a second accumulator set the
// samoyeds fold leaves no registers for. A row of zeros gets scale 0 and zero bytes.
#pragma once

#include "config.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace samoyeds {

// ROW_WARPS warps per row, 16-byte loads, each thread's QUANTIZE_CHUNKS_IN_FLIGHT chunks of a round loaded before
// any is used: a row of up to 32 x ROW_WARPS x 8 chunks is read once, in one round trip, and quantized from
// registers; a longer row is read in rounds, twice (its magnitude, then its bytes). A loop with one load per
// iteration waited for a round trip per chunk. One warp a row (ROW_WARPS = 1: 2048 bf16 inputs a round) for rows
// that short or that many; a block a row (ROW_WARPS = the block's warps, their maxima met in shared memory) for a
// few long rows (plan.quantize_row_warps): a decode step's rows then have 8x the warps, and a 14336-input row
// (Mixtral's intermediate) one round instead of 7 read twice (12.2 us for its 32 rows at T = 16 one warp a row).
template <typename T, bool GATE_UP, int ROW_WARPS>
__global__ void quantize_rows(const __grid_constant__ MoEParams p) {
  // x comes from before the routing index, the kernel launched just before this one: quantizing it needs nothing
  // that kernel writes, so the wait comes at the end (this kernel's end then still implies the index's). act is
  // written by the kernel just before.
  if (!GATE_UP) grid_dependency_wait();
  const T* __restrict__ src = static_cast<const T*>(GATE_UP ? p.x : p.act);
  uint8_t* __restrict__ dst = static_cast<uint8_t*>(GATE_UP ? p.x_fp8 : p.act_fp8);
  float* __restrict__ scale = GATE_UP ? p.x_scale : p.act_scale;
  const int rows = GATE_UP ? p.tokens : p.slots, K = GATE_UP ? p.hidden : p.inter;  // K: whole k tiles of BK
  constexpr int WARPS = ELEMENTWISE_THREADS / 32, U = QUANTIZE_CHUNKS_IN_FLIGHT;
  static_assert(ROW_WARPS == 1 || ROW_WARPS == WARPS, "a warp or the whole block a row");
  constexpr int ROW_THREADS = 32 * ROW_WARPS, ROUND = ROW_THREADS * U, ROWS_PER_BLOCK = WARPS / ROW_WARPS;
  __shared__ float warp_amax[ROW_WARPS];  // a block a row: each warp's largest magnitude
  const int lane = threadIdx.x & 31, lid = threadIdx.x % ROW_THREADS, chunks = K / 8;
  // A block a row: every thread of the block takes the same rows (the barriers below need that).
  for (int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / ROW_THREADS; row < rows;
       row += gridDim.x * ROWS_PER_BLOCK) {
    const uint4* in = reinterpret_cast<const uint4*>(src + (size_t)row * K);
    uint4 v[U];  // the round's chunks (lid + ROW_THREADS u); a one-round row keeps them for the bytes
    auto load_round = [&](int base) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + ROW_THREADS * u + lid < chunks) v[u] = in[base + ROW_THREADS * u + lid];
    };
    float amax = 0.0f;
    for (int base = 0; base < chunks; base += ROUND) {
      load_round(base);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (base + ROW_THREADS * u + lid < chunks) {
          const T* e = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
          for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf((float)e[i]));
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if constexpr (ROW_WARPS > 1) {
      if (lane == 0) warp_amax[threadIdx.x / 32] = amax;
      __syncthreads();
#pragma unroll
      for (int w = 0; w < ROW_WARPS; ++w) amax = fmaxf(amax, warp_amax[w]);
    }
    const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
    if (lid == 0) scale[row] = amax / 448.0f;
    uint2* out = reinterpret_cast<uint2*>(dst + (size_t)row * K);
    for (int base = 0; base < chunks; base += ROUND) {
      if (chunks > ROUND) load_round(base);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = base + ROW_THREADS * u + lid;
        if (c < chunks) {
          const T* e = reinterpret_cast<const T*>(&v[u]);
          unsigned word[2];
#pragma unroll
          for (int w = 0; w < 2; ++w)
            word[w] = e4m3x2((float)e[4 * w] * inv, (float)e[4 * w + 1] * inv) |
                      ((unsigned)e4m3x2((float)e[4 * w + 2] * inv, (float)e[4 * w + 3] * inv) << 16);
          out[c] = make_uint2(word[0], word[1]);
        }
      }
    }
    if constexpr (ROW_WARPS > 1) __syncthreads();  // every warp has read warp_amax before the next row writes it
  }
  if (GATE_UP) grid_dependency_wait();
}

}  // namespace samoyeds
