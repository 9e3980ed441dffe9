// PTX wrappers: every instruction the kernels issue that CUDA C++ does not spell, one small function each, and the
// few type helpers they need. Layout conventions of the operands are those of the sparse MMA instructions
// (PTX ISA, "Sparse matrix multiply-accumulate"; docs/design.md): the
// compressed A operand of mma.sp / wgmma.sp holds 2 of every 4 inputs, and its 32-bit selector e gives their
// positions as the ordered-metadata nibbles that samoyeds_vllm/format/packing.py stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace samoyeds {

// NVRTC has no <stdint.h>: the fixed-width types the packed format uses.
using int16_t = short;
using uint16_t = unsigned short;
using uint8_t = unsigned char;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; src_bytes = 0 fills zeros (padding tokens of a partial tile).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// A if C, else B (NVRTC has no <type_traits>).
template <bool C, typename A, typename B> struct Pick { using type = A; };
template <typename A, typename B> struct Pick<false, A, B> { using type = B; };

// The tensor-core type name of an activation type, for the instruction strings below ("bf16" or "f16").
template <typename T> constexpr bool IS_BF16 = false;
template <> constexpr bool IS_BF16<__nv_bfloat16> = true;

// Two float8 e4m3 values as a T x 2 register (T = bf16 or fp16), exactly, for the A operand of mma.sp / wgmma.sp:
// bytes HI ? 2, 3 : 0, 1 of q, the first in the low half. Moving e4m3's sign, exponent and mantissa bits into T's
// fields gives value * 2^(7 - T's exponent bias) for every e4m3 value (zero stays zero, e4m3 subnormals become T
// subnormals, also exact), and one multiply by the power of two undoes that. No cvt instruction turns e4m3 into
// bf16 before sm_100 (cvt.f16x2.e4m3x2 needs sm_89 and gives fp16 only), and this runs on sm_80 as well.
template <typename T, bool HI>
__device__ __forceinline__ unsigned fp8x2_to(unsigned q) {
  const unsigned spread = __byte_perm(q, 0u, HI ? 0x4342u : 0x4140u);  // one byte in the low byte of each half
  constexpr int SHIFT = IS_BF16<T> ? 4 : 7;  // e4m3's 7 exponent + mantissa bits to T's mantissa boundary
  const unsigned bits = ((spread & 0x00800080u) << 8) | ((spread & 0x007f007fu) << SHIFT);
  if constexpr (IS_BF16<T>) {
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
                                     __floats2bfloat162_rn(0x1p120f, 0x1p120f));  // 2^(127 - 7)
    return *reinterpret_cast<const unsigned*>(&v);
  } else {
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&bits), __floats2half2_rn(256.0f, 256.0f));
    return *reinterpret_cast<const unsigned*>(&v);  // 2^(15 - 7)
  }
}

// D += A (16x32, 2:4 compressed to 16x16) * B (32x8); metadata e from lanes 4g, 4g+1 (selector 0).
#define SAMOYEDS_MMA_SP(TYPE)                                                                                   \
  asm volatile("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32." TYPE "." TYPE ".f32 "             \
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"                      \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e))
template <typename T>
__device__ __forceinline__ void mma_sp(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[4], unsigned e) {
  if constexpr (IS_BF16<T>) SAMOYEDS_MMA_SP("bf16");
  else SAMOYEDS_MMA_SP("f16");
}
#undef SAMOYEDS_MMA_SP

// The wgmma accumulator operands: n8 tiles 0-7 of d (N = 64), and 8-15 (the rest of N = 128).
#define SAMOYEDS_D_0_7                                                                                                 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),             \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),       \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),       \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define SAMOYEDS_D_8_15                                                                                                \
  "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]),             \
      "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]),                   \
      "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]),                  \
      "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),                  \
      "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),                  \
      "+f"(d[15][3])

// Hopper (sm_90a): the same product for a whole warpgroup, 64 weight rows x N tokens x 32 inputs, issued
// asynchronously. A from registers (each warp its 16 rows, the mma.sp fragment), B (N tokens x 32 inputs) read
// by the tensor cores from 128-byte-swizzled shared memory through a descriptor; D is exactly the mma.sp
// accumulators of the warp's N / 8 n8 tiles. Needs wgmma_fence() after other instructions touched a or d, and
// commit / wait before d is read.
#define SAMOYEDS_WGMMA_SP_RS_N64(TYPE)                                                                          \
  asm volatile(                                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                               \
      "wgmma.mma_async.sp.sync.aligned.m64n64k32.f32." TYPE "." TYPE " "                                         \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
      "%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, %37, 0, p, 1, 1, 0;\n}\n"                                      \
      : SAMOYEDS_D_0_7                                                                                          \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e))
#define SAMOYEDS_WGMMA_SP_RS_N128(TYPE)                                                                         \
  asm volatile(                                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                               \
      "wgmma.mma_async.sp.sync.aligned.m64n128k32.f32." TYPE "." TYPE " "                                        \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
      "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,"     \
      "%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, %69, 0, p, 1, 1, 0;\n}\n"           \
      : SAMOYEDS_D_0_7, SAMOYEDS_D_8_15                                                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e))

template <typename T, int N>
__device__ __forceinline__ void wgmma_sp_rs(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b_desc,
                                            unsigned e) {
  static_assert(N == 64 || N == 128, "token tiles of 64 or 128");
  if constexpr (N == 64 && IS_BF16<T>) SAMOYEDS_WGMMA_SP_RS_N64("bf16");
  else if constexpr (N == 64) SAMOYEDS_WGMMA_SP_RS_N64("f16");
  else if constexpr (IS_BF16<T>) SAMOYEDS_WGMMA_SP_RS_N128("bf16");
  else SAMOYEDS_WGMMA_SP_RS_N128("f16");
}
#undef SAMOYEDS_WGMMA_SP_RS_N64
#undef SAMOYEDS_WGMMA_SP_RS_N128

// The same with A (64 rows x 16 compressed values) also read from shared memory through a descriptor, for the
// warp-specialised kernel: no A registers, so nothing but d and e is tied to an instruction in flight. N = 64 or
// 128 tokens (d: N / 8 n8 tiles of the mma.sp accumulator layout).
#define SAMOYEDS_WGMMA_SP_SS_N64(TYPE)                                                                                 \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                       \
      "wgmma.mma_async.sp.sync.aligned.m64n64k32.f32." TYPE "." TYPE " "                                               \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"        \
      "%28,%29,%30,%31}, %32, %33, %34, 0, p, 1, 1, 0, 0;\n}\n"                                                        \
      : SAMOYEDS_D_0_7                                                                                                 \
      : "l"(a_desc), "l"(b_desc), "r"(e))
#define SAMOYEDS_WGMMA_SP_SS_N128(TYPE)                                                                                \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                       \
      "wgmma.mma_async.sp.sync.aligned.m64n128k32.f32." TYPE "." TYPE " "                                              \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"        \
      "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,"           \
      "%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, %66, 0, p, 1, 1, 0, 0;\n}\n"                            \
      : SAMOYEDS_D_0_7, SAMOYEDS_D_8_15                                                                                \
      : "l"(a_desc), "l"(b_desc), "r"(e))

template <typename T, int N>
__device__ __forceinline__ void wgmma_sp_ss(float (&d)[N / 8][4], unsigned long long a_desc, unsigned long long b_desc,
                                            unsigned e) {
  static_assert(N == 64 || N == 128, "token tiles of 64 or 128");
  if constexpr (N == 64 && IS_BF16<T>) SAMOYEDS_WGMMA_SP_SS_N64("bf16");
  else if constexpr (N == 64) SAMOYEDS_WGMMA_SP_SS_N64("f16");
  else if constexpr (IS_BF16<T>) SAMOYEDS_WGMMA_SP_SS_N128("bf16");
  else SAMOYEDS_WGMMA_SP_SS_N128("f16");
}
#undef SAMOYEDS_WGMMA_SP_SS_N64
#undef SAMOYEDS_WGMMA_SP_SS_N128

// FP8 activations: the product with both operands float8 e4m3, 64 weight rows x N tokens x 64 inputs per
// instruction, at twice the rate of T x T (the ws kernel's wide tiles, and the decode tiles of gemm_mma.cuh: Hopper
// has no FP8 mma.sync; ptxas turns an e4m3 mma.sp into f16 conversions and f16 MMAs). A from registers: the mma.sp
// m16n8k64 fragment of the warp's 16 rows (a[0] row g, compressed bytes 4t .. 4t + 3 of the k-step, the first in the
// low byte; a[1] row g + 8; a[2], a[3] bytes 16 + 4t ..), B (N tokens x 64 inputs of one byte) from
// 128-byte-swizzled shared memory, D as above. The metadata word of lane t holds 8 consecutive 4-input groups of one
// row, row g + 8 (t & 1), groups 8 (t >> 1) ..: not bf16's layout (tests/gpu/test_sparse_mma_layouts.py checks it).
// The tensor cores add the products with fewer bits than fp32 (about 2^-12 of the largest output on an H100).
#define SAMOYEDS_WGMMA_SP_E4M3_N64                                                                                     \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                       \
      "wgmma.mma_async.sp.sync.aligned.m64n64k64.f32.e4m3.e4m3 "                                                       \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"        \
      "%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, %37, 0, p, 1, 1;\n}\n"                                                 \
      : SAMOYEDS_D_0_7                                                                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e))
#define SAMOYEDS_WGMMA_SP_E4M3_N128                                                                                    \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                       \
      "wgmma.mma_async.sp.sync.aligned.m64n128k64.f32.e4m3.e4m3 "                                                      \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"        \
      "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,"           \
      "%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, %69, 0, p, 1, 1;\n}\n"                    \
      : SAMOYEDS_D_0_7, SAMOYEDS_D_8_15                                                                                \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e))

template <int N>
__device__ __forceinline__ void wgmma_sp_e4m3(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b_desc,
                                              unsigned e) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128, "token tiles of 8 to 128");
  if constexpr (N == 8) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sp.sync.aligned.m64n8k64.f32.e4m3.e4m3 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, %9, 0, p, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e));
  } else if constexpr (N == 16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sp.sync.aligned.m64n16k64.f32.e4m3.e4m3 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, %13, 0, p, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e));
  } else if constexpr (N == 32) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sp.sync.aligned.m64n32k64.f32.e4m3.e4m3 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
                 "{%16,%17,%18,%19}, %20, %21, 0, p, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e));
  } else if constexpr (N == 64) {
    SAMOYEDS_WGMMA_SP_E4M3_N64;
  } else {
    SAMOYEDS_WGMMA_SP_E4M3_N128;
  }
}
#undef SAMOYEDS_WGMMA_SP_E4M3_N64
#undef SAMOYEDS_WGMMA_SP_E4M3_N128
#undef SAMOYEDS_D_0_7
#undef SAMOYEDS_D_8_15

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving reads or writes of d across a wgmma fence / wait (it sees no dependency there).
template <int N>
__device__ __forceinline__ void wgmma_pin(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
}
// The issued wgmmas of the warpgroup finish; their accumulators may be read only after this.
template <int MT, int NT>
__device__ __forceinline__ void wgmma_drain(float (&acc)[MT][NT][4]) {
  wgmma_commit();
  wgmma_wait_all();
#pragma unroll
  for (int h = 0; h < MT; ++h) wgmma_pin(acc[h]);
}
// cp.async wrote the tiles through the generic proxy; wgmma reads them through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// mbarriers (shared memory, CTA scope): the stage hand-over between the producer and the consumer warpgroups.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives on `bar` once every cp.async this thread has issued so far has landed (.noinc: the arrival is one of the
// count the barrier was initialised with).
__device__ __forceinline__ void mbar_arrive_on_copies(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// The TMA engine's 1D copy (sm_90): `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory to
// this block's shared memory, counted on `bar` as transaction bytes: the barrier's phase completes once the bytes
// an arrival announced (mbar_arrive_expect_tx) have landed. One thread issues what 128 threads' cp.async would.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// An arrival on `bar` that also announces `bytes` more transaction bytes for its phase (bulk_copy).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Waits until the phase with this parity has completed (phases alternate 0, 1, 0, ... from the init).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Programmatic dependent launch (sm_90+; kernels/build.py launches every kernel of a forward with it there): a kernel's
// blocks may start while the kernel before it in the stream still runs. Code before grid_dependency_wait() must not
// read what that kernel writes; after it, every earlier kernel has finished and its writes are visible. The next kernel
// may start once every block of this one has called allow_dependents() or exited: moe_gemm and the one-token kernels
// call it before their epilogue, the routing index (one block) right after its wait, the other kernels let their exit
// do it. Called right after the wait by every kernel, the next kernel's blocks took SM room while this one ran and made
// the Mixtral-8x7B FP8 layer 15% slower at T = 1 and 4% at T = 256 (H200, docs/benchmarks.md). Since no kernel lets the
// next start before its own wait, code before a wait may read what the kernels two or more launches back wrote: the one
// in between has passed its wait, so they have finished. Before sm_90 both are nothing.
__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Barrier 1 for the 128 threads of the copier warpgroup only (barrier 0 is __syncthreads).
__device__ __forceinline__ void copier_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }
// Moves registers between the warpgroups of a block (sm_90a): the copying warpgroup needs few, the MMA ones many.
template <int N>
__device__ __forceinline__ void regs_shrink() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_grow() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Descriptor of a K-major, 128-byte-swizzled operand tile (B, or A in the ws kernel) starting at p: rows 128 B
// apart, 8-row atoms 1 KB apart.
__device__ __forceinline__ unsigned long long sw128_desc(const void* p) {
  return (unsigned long long)((smem_addr(p) & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

// Two floats as float8 e4m3 bytes, rounded to nearest and saturated to +-448, `first` in the low byte (sm_89+;
// cvt puts its first source in the high half).
__device__ __forceinline__ unsigned short e4m3x2(float first, float second) {
  unsigned short r = 0;
#if __CUDA_ARCH__ >= 890
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(second), "f"(first));
#endif
  return r;
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }

// Two adjacent outputs (a row pair's even and odd row) in one 4-byte store.
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store_pair(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

}  // namespace samoyeds
