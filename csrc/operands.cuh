// What one of the layer's two expert GEMMs reads and writes, taken from the layer's MoEParams (params.cuh) by both
// GEMM kernels. The weights are the sparse A operand (rows = output features), the tokens of one expert the dense
// B operand (columns), so a decode step with a handful of tokens per expert still runs full tensor-core tiles of
// weights:
//   GATE_UP = true :  act[pos, :] = SiLU(W1_e x_t) * (W3_e x_t)      x_t read in place through the routing index
//   GATE_UP = false:  y[slot, :]  = w_slot * W2_e act[pos, :]        routing weight fused; y summed over top-k later
#pragma once

#include "params.cuh"
#include "ptx.cuh"

namespace samoyeds {

// The element type of packed values: T, or the raw bytes of FP8 e4m3 values.
template <typename T, bool FP8> struct ValueOf { using type = T; };
template <typename T> struct ValueOf<T, true> { using type = uint8_t; };

template <typename T, bool GATE_UP>
struct GemmOperands {
  const MoEParams& p;  // the kernel's __grid_constant__ parameters

  __device__ __forceinline__ const PackedExperts& weights() const { return GATE_UP ? p.w13 : p.w2; }
  // B rows. GATE_UP: x [tokens, K]; else act [slots, K] in sorted order
  __device__ __forceinline__ const T* x() const { return static_cast<const T*>(GATE_UP ? p.x : p.act); }
  // The B rows a GEMM reads: x() (T), or their FP8 copies (quantize.cuh) with one scale per row
  template <bool ACT8>
  __device__ __forceinline__ const typename Pick<ACT8, uint8_t, T>::type* b_rows() const {
    if constexpr (ACT8) return static_cast<const uint8_t*>(GATE_UP ? p.x_fp8 : p.act_fp8);
    else return x();
  }
  __device__ __forceinline__ const float* b_scale() const { return GATE_UP ? p.x_scale : p.act_scale; }
  // T, or the bytes of FP8 values
  template <typename W = T>
  __device__ __forceinline__ const W* values() const { return static_cast<const W*>(weights().values); }
  __device__ __forceinline__ const float* scale() const { return weights().scale; }
  __device__ __forceinline__ const int16_t* meta() const { return weights().meta; }
  __device__ __forceinline__ const uint8_t* rowsel() const { return weights().rowsel; }
  // GATE_UP: act by sorted position; else y by original slot
  __device__ __forceinline__ T* out() const { return static_cast<T*>(GATE_UP ? p.act : p.y); }
  // split-K partial sums (GEMM 2 writes them to y itself, which is fp32 then)
  __device__ __forceinline__ float* partial() const { return GATE_UP ? p.gate_up_partial : static_cast<float*>(p.y); }
  __device__ __forceinline__ int R() const { return weights().rows; }  // packed rows per expert (both halves)
  __device__ __forceinline__ int K() const { return GATE_UP ? p.hidden : p.inter; }  // dense inputs
  __device__ __forceinline__ int N_out() const { return GATE_UP ? p.inter : p.hidden; }  // output row stride
};

}  // namespace samoyeds
