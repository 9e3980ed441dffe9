// The GEMM epilogue both kernels share: accumulators to outputs (SiLU(gate) * up for GEMM 1, the routing-weighted
// row for GEMM 2, or raw fp32 partial sums under split-K for reduce.cuh to finish).
#pragma once

#include "ptx.cuh"

namespace samoyeds {

// SiLU with a fast division (an approximate reciprocal, ~2 ulp, instead of the IEEE division's longer sequence in
// the gate/up epilogue). For v below about -87, 1 + exp(-v) is past 2^126 and the result is 0, SiLU's limit there.
__device__ __forceinline__ float silu(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

// FP8 values: each accumulator, a dot product with the quantized row, times its dense output row's scale (the
// output rows of store_tile below; scale: the expert's [output rows], gate rows then up rows for GATE_UP). Once per
// output, after the samoyeds fold has split the pairs, so the k loop does no scaling.
template <bool SAMOYEDS, bool GATE_UP, int MT, int NT>
__device__ __forceinline__ void scale_rows(float (&even)[MT][NT][4], float (&odd)[MT][NT][4], const int (&crow)[MT],
                                           int lane, const float* __restrict__ scale, int N_out) {
  const int g = lane >> 2;
#pragma unroll
  for (int h = 0; h < MT; ++h)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = crow[h] + g + 8 * r;
      const int out_row = (GATE_UP ? h * N_out : 0) + (SAMOYEDS ? 2 * row : row);
      const float s_even = scale[out_row], s_odd = SAMOYEDS ? scale[out_row + 1] : 0.0f;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 2 * r; i < 2 * r + 2; ++i) {
          even[h][j][i] *= s_even;
          if (SAMOYEDS) odd[h][j][i] *= s_odd;
        }
    }
}

// FP8 activations in GEMM 1: each accumulator times its token column's scale (quantize.cuh), before the SiLU.
// column_scale(n): the scale of tile column n.
template <bool SAMOYEDS, int MT, int NT, typename ColumnScale>
__device__ __forceinline__ void scale_columns(float (&even)[MT][NT][4], float (&odd)[MT][NT][4], int lane,
                                              ColumnScale column_scale) {
  const int t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float s = column_scale(8 * j + 2 * t + c);
#pragma unroll
      for (int h = 0; h < MT; ++h)
#pragma unroll
        for (int i = c; i < 4; i += 2) {
          even[h][j][i] *= s;
          if (SAMOYEDS) odd[h][j][i] *= s;
        }
    }
}

// Writes one warp's accumulators: acc[h][j][i] is condensed row crow[h] + g + 8 (i / 2) of m tile h (for GATE_UP
// a row of the gate half, h = 0 gate, 1 up) and tile column 8 j + 2 t + i % 2; samoyeds: even / odd are output rows
// 2 crow and 2 crow + 1. GATE_UP: act = SiLU(gate) * up by sorted position; else the routing-weighted row by
// original slot. With split-K (gridDim.z > 1) the raw fp32 sums go to `partial` and the split epilogues finish.
// slot_at(n): the output row of token column n (-1: padding), weight_at(n): its routing weight (by sorted position,
// beside the slot; GATE_UP stores no weight).
template <typename T, bool SAMOYEDS, bool GATE_UP, int MT, int NT, typename SlotAt, typename WeightAt>
__device__ __forceinline__ void store_tile(const float (&even)[MT][NT][4], const float (&odd)[MT][NT][4],
                                           const int (&crow)[MT], int lane, SlotAt slot_at, WeightAt weight_at,
                                           T* __restrict__ out, float* __restrict__ partial, int N_out, int slots) {
  const int g = lane >> 2, t = lane & 3;
  const bool split = gridDim.z > 1;
  auto out_col = [&](int h, int i) {  // output column of even[h][.][i] (odd: the next one, samoyeds)
    const int row = crow[h] + g + (i >> 1) * 8;
    return (GATE_UP ? h * N_out : 0) + (SAMOYEDS ? 2 * row : row);
  };
  // The slot and routing weight of each of the thread's columns, all loads of a group of up to 8 n8 tiles issued
  // before any is used (in the store loop each was a dependent pair of global loads per column: ncu put ~45% of
  // GEMM 2's time there; the ws kernel takes them from shared memory). The weights are read by sorted position,
  // so their loads do not wait for the slots'.
  constexpr int GROUP = NT < 8 ? NT : 8;
#pragma unroll
  for (int j0 = 0; j0 < NT; j0 += GROUP) {
    int slot_of[GROUP][2];
    float weight_of[GROUP][2];
#pragma unroll
    for (int j = 0; j < GROUP; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        slot_of[j][c] = slot_at((j0 + j) * 8 + 2 * t + c);
      }
#pragma unroll
    for (int j = 0; j < GROUP; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        weight_of[j][c] = GATE_UP ? 1.0f : weight_at((j0 + j) * 8 + 2 * t + c);
#pragma unroll
    for (int jj = 0; jj < GROUP; ++jj) {
      const int j = j0 + jj;
      if (!SAMOYEDS && !GATE_UP && !split) {
        // 2:4 GEMM 2: a lane holds rows g (and g + 8) of two columns; lane ^ 4 holds rows g ^ 1 of the same two.
        // Swapping one value makes each lane hold two adjacent rows of one column (even g: column 2t, odd g:
        // 2t + 1), so each pair is one 4-byte store instead of two 2-byte ones (H100, A/B: Qwen3 and OLMoE 2:4
        // 1-3% faster at T = 4096 / 16384; samoyeds already stores row pairs).
        const int c = g & 1;
        const int slot = c ? slot_of[jj][1] : slot_of[jj][0];
        const float w = c ? weight_of[jj][1] : weight_of[jj][0];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < MT; ++h) {
            const float col0 = even[h][j][2 * r], col1 = even[h][j][2 * r + 1];  // (selects: no indexed registers)
            const float mine = c ? col1 : col0;
            const float got = __shfl_xor_sync(0xffffffffu, c ? col0 : col1, 4);
            if (slot < 0) continue;
            store_pair(out + (size_t)slot * N_out + crow[h] + (g & ~1) + 8 * r, w * (c ? got : mine),
                       w * (c ? mine : got));
          }
        continue;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (slot_of[jj][i & 1] < 0) continue;
        const size_t slot = (size_t)slot_of[jj][i & 1];
        const float w = weight_of[jj][i & 1];
        if (split) {  // raw partial sums; the reduction kernels below finish the epilogue
          float* dst =
              partial + ((size_t)blockIdx.z * slots + slot) * (GATE_UP ? 2 * (size_t)N_out : (size_t)N_out);
#pragma unroll
          for (int h = 0; h < MT; ++h) {
            if (SAMOYEDS) {
              *reinterpret_cast<float2*>(dst + out_col(h, i)) = make_float2(w * even[h][j][i], w * odd[h][j][i]);
            } else {
              dst[out_col(h, i)] = w * even[h][j][i];
            }
          }
          continue;
        }
        T* dst = out + slot * N_out;
        if (GATE_UP) {
          const float act_even = silu(even[0][j][i]) * even[1][j][i];
          if (SAMOYEDS) store_pair(dst + out_col(0, i), act_even, silu(odd[0][j][i]) * odd[1][j][i]);
          else dst[out_col(0, i)] = from_float<T>(act_even);
        } else {  // samoyeds (2:4 took the paired stores above)
#pragma unroll
          for (int h = 0; h < MT; ++h) store_pair(dst + out_col(h, i), w * even[h][j][i], w * odd[h][j][i]);
        }
      }
    }
  }
}

}  // namespace samoyeds
