// Dual-side structured-sparse MoE experts on sparse tensor cores: mma.sp on sm_80+, and wgmma.mma_async.sp for
// wide token tiles on Hopper (sm_90a). samoyeds_vllm/kernels/ compiles this file at first use (NVRTC through CuPy,
// with this directory on the include path) and launches its kernels with one MoEParams (params.cuh).
//
// One MoE forward:
//   1. routing.cuh   the routing index: slots (token, j) sorted by expert, cut into token tiles of one expert;
//   2. gemm_*.cuh    GEMM 1, gate and up, SiLU(gate) * up fused, reading the tokens' rows of x in place;
//   3. gemm_*.cuh    GEMM 2, down, the routing weight fused, one output row per slot;
//   4. reduce.cuh    each token's sum over its top-k slots (and the split-K sums of small batches).
// One token takes one_token.cuh instead: GEMM 1 and GEMM 2 whose blocks add their warps' parts themselves (no index,
// no reductions after them).
// gemm_mma.cuh runs decode and mid-size batches (and everything before Hopper), gemm_ws.cuh the wide token tiles
// on Hopper; both read the weights exactly in the packed layout of samoyeds_vllm/format/packing.py:
//   values [E, R, K/2]  the kept values; R = out rows (2:4) or out rows / 2 (samoyeds: one condensed row per pair)
//   meta   [E, R, K/16] int16: per 16 inputs, 4 nibbles p0 | p1 << 2 (the ordered sparse-MMA metadata of a row)
//   rowsel [E, R, K/V]  uint8 (samoyeds): which row of pair r receives condensed row r in segment s; stored
//                       segment-major ([E, K/V, R] in memory: kernels/weights.py), so the selections of a run
//                       of rows in one segment are contiguous bytes that the copies bring in with each stage
//   (FP8 activations: quantize.cuh makes the e4m3 copies of x and act that GEMM 1 and GEMM 2 then read.)
// The other headers: ptx.cuh (instruction wrappers), tiles.cuh (shared-memory tiles), operands.cuh (a GEMM's
// operands), fold.cuh (samoyeds row pairs in one accumulator set), epilogue.cuh (accumulators to outputs),
// config.cuh (constants shared with the host code).

#include "config.cuh"
#include "gemm_mma.cuh"
#include "gemm_ws.cuh"
#include "one_token.cuh"
#include "params.cuh"
#include "quantize.cuh"
#include "reduce.cuh"
#include "routing.cuh"
