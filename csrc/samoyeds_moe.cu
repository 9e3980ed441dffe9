// Dual-side structured-sparse MoE expert GEMMs (sparse tensor cores: mma.sp on sm_80+, and wgmma.mma_async.sp for
// wide token tiles on Hopper, sm_90a).
//
// One kernel template serves both GEMMs of an MoE layer:
//   GATE_UP = true :  act[pos, :] = SiLU(W1_e x_t) * (W3_e x_t)      x_t read in place through the routing index
//   GATE_UP = false:  y[slot, :]  = w_slot * W2_e act[pos, :]        routing weight fused; y summed over top-k later
// The weights are the sparse A operand (rows = output features), the tokens of one expert the dense B operand
// (columns), so a decode step with a handful of tokens per expert still runs full tensor-core tiles of weights.
//
// Weights are read exactly in the packed layout of samoyeds_vllm/formats.py (format version 1):
//   values [E, R, K/2]  the kept values; R = out rows (2:4) or out rows / 2 (samoyeds: one condensed row per pair)
//   meta   [E, R, K/16] int16: per 16 inputs, 4 nibbles p0 | p1 << 2 (the ordered sparse-MMA metadata of a row)
//   rowsel [E, R, K/V]  uint8 (samoyeds): which row of pair r receives condensed row r in segment s; stored
//                       segment-major ([E, K/V, R] in memory, kernels.kernel_rowsel), so the selections of a run
//                       of rows in one segment are contiguous bytes that the copies bring in with each stage
// For samoyeds each thread multiplies into one accumulator per pair (the sum of both rows' partial products) and
// keeps a second one that tracks the odd row's share, updated by one FFMA per segment (fold_segment): two
// accumulator sets, so token tiles as wide as for 2:4.
//
// Work decomposition:
//   blockIdx.x: MT slabs of BM = WARPS x 16 condensed weight rows (64 to 256 rows): for GATE_UP the same BM rows
//               of gate and of up, so SiLU(gate) * up is computed in registers; for GEMM 2 one or two stacked slabs.
//   blockIdx.y: one token tile: up to BN (token, expert) slots of one expert, described by tile_expert /
//               tile_start / tile_rows (built on the GPU by the host code, no host synchronisation). Tiles past
//               the last one have tile_rows = 0 and exit at once, so the grid can be sized without knowing the
//               routing; experts without tokens have no tiles and cost nothing.
//   k loop:     BK = 128 dense inputs per stage, STAGES-deep cp.async pipeline into XOR-swizzled shared memory,
//               ldmatrix into exactly the mma.sp fragments (the compressed A tile has the dense m16n8k16 layout);
//               with WGMMA the tensor cores read B from shared memory themselves (one wgmma per m tile and k-step).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace samoyeds {

// NVRTC has no <stdint.h>: the fixed-width types the packed format uses.
using int16_t = short;
using uint16_t = unsigned short;
using uint8_t = unsigned char;

constexpr int BK = 128;         // dense inputs per pipeline stage (4 mma.sp k-steps of 32)
constexpr int STAGES = 3;

// ------------------------------------------------------------------------------------------- PTX wrappers

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

// The tensor-core type name of an activation type, for the instruction strings below ("bf16" or "f16").
template <typename T> constexpr bool IS_BF16 = false;
template <> constexpr bool IS_BF16<__nv_bfloat16> = true;

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

// Hopper (sm_90a): the same product for a whole warpgroup, 64 weight rows x 64 tokens x 32 inputs, issued
// asynchronously. A from registers (each warp its 16 rows, the mma.sp fragment), B (64 tokens x 32 inputs) read
// by the tensor cores from 128-byte-swizzled shared memory through a descriptor; D is exactly the mma.sp
// accumulators of the warp's 8 n8 tiles. Needs wgmma_fence() after other instructions touched a or d, and
// commit / wait before d is read.
#define SAMOYEDS_WGMMA_SP_N64(TYPE)                                                                             \
  asm volatile(                                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                               \
      "wgmma.mma_async.sp.sync.aligned.m64n64k32.f32." TYPE "." TYPE " "                                         \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
      "%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, %37, 0, p, 1, 1, 0;\n}\n"                                      \
      : SAMOYEDS_D_0_7                                                                                          \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(e))

template <typename T>
__device__ __forceinline__ void wgmma_sp_n64(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b_desc,
                                             unsigned e) {
  if constexpr (IS_BF16<T>) SAMOYEDS_WGMMA_SP_N64("bf16");
  else SAMOYEDS_WGMMA_SP_N64("f16");
}
#undef SAMOYEDS_WGMMA_SP_N64

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
// Waits until the phase with this parity has completed (phases alternate 0, 1, 0, ... from the init).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
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

// Fast division (an approximate reciprocal, ~2 ulp) instead of the IEEE division's longer sequence in the gate/up
// epilogue (changed with the staged row selections, not timed alone). For v below about -87, 1 + exp(-v) is past
// 2^126 and the result is 0, SiLU's limit there.
__device__ __forceinline__ float silu(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

// The samoyeds fold (see the header). acc, the MMA target, sums the partial products of both rows of a pair; odd
// holds what turns that into the odd row's sum: after the fold before segment s, the odd row's sum is
// odd + (kept_odd ? acc : 0). A segment whose kept row differs from the previous one's moves acc's running sum in
// or out of that: one FFMA per accumulator (factor +1, -1 or 0), and acc itself is only read, so it stays in the
// registers the MMA writes. sel[h][r]: the rowsel bytes of the stage for rows g (r = 0) and g + 8 (r = 1) of m
// tile h; kept_odd: the previous segment's kept rows.
template <int MT, int NT, typename SelWord>
__device__ __forceinline__ void fold_segment(const float (&acc)[MT][NT][4], float (&odd)[MT][NT][4],
                                             const SelWord (&sel)[MT][2], bool (&kept_odd)[MT][2], int seg) {
#pragma unroll
  for (int h = 0; h < MT; ++h)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool now_odd = ((sel[h][r] >> (8 * seg)) & 0xff) != 0;
      const float factor = (float)kept_odd[h][r] - (float)now_odd;
      kept_odd[h][r] = now_odd;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 2 * r; i < 2 * r + 2; ++i) odd[h][j][i] = fmaf(factor, acc[h][j][i], odd[h][j][i]);
    }
}
// After the last segment: acc becomes the even row's sum, odd the odd row's.
template <int MT, int NT>
__device__ __forceinline__ void unfold(float (&acc)[MT][NT][4], float (&odd)[MT][NT][4],
                                       const bool (&kept_odd)[MT][2]) {
#pragma unroll
  for (int h = 0; h < MT; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        odd[h][j][i] = kept_odd[h][i >> 1] ? odd[h][j][i] + acc[h][j][i] : odd[h][j][i];
        acc[h][j][i] -= odd[h][j][i];
      }
}
// The rowsel bytes of a stage for rows g and g + 8 of each m tile, from the stage's SelTile; row[h]: row g of
// tile h in the block's row order. Segment j of the stage is byte j of the word.
template <int MT, int SEGS, int A_ROWS, typename SelWord>
__device__ __forceinline__ void stage_sel(SelWord (&sel)[MT][2], const uint8_t* tile, const int (&row)[MT]) {
#pragma unroll
  for (int h = 0; h < MT; ++h)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      SelWord word = 0;
#pragma unroll
      for (int j = 0; j < SEGS; ++j) word |= (SelWord)tile[j * A_ROWS + row[h] + 8 * r] << (8 * j);
      sel[h][r] = word;
    }
}

// ------------------------------------------------------------------------------------ shared-memory tiles
// A tile: rows x 64 compressed values (128 B = 8 chunks of 16 B); chunk c of row r lives at c ^ (r & 7), so the
// 8 rows one ldmatrix reads fall in 8 different bank groups. B tile: BN tokens x 128 inputs in two 64-input panels
// (BTile::at), the same XOR inside each panel.
// Meta tile: rows x 8 halfwords (the metadata of 128 dense inputs), unswizzled (read as scalars).

template <int ROWS> struct ATile { uint4 chunk[ROWS * 8]; };
template <int BN> struct BTile {
  uint4 chunk[BN * 16];
  // Chunk c (8 inputs) of token row n: two panels of 64 inputs, rows 128 B apart, chunk c % 8 of a row
  // at (c % 8) ^ (n % 8): the 128-byte-swizzled K-major layout wgmma reads, and conflict-free for ldmatrix.
  static __device__ __forceinline__ int at(int n, int c) { return (c >> 3) * BN * 8 + n * 8 + ((c & 7) ^ (n & 7)); }
};
template <int ROWS> struct MetaTile { uint16_t half[ROWS * 8]; };

template <int BN, int A_ROWS>  // A_ROWS: all weight rows of the block (gate rows then up rows for GATE_UP)
struct Stage {  // every member a multiple of 1 KB for A_ROWS % 64 == 0, so b stays 1 KB aligned (wgmma swizzle atoms)
  BTile<BN> b;
  ATile<A_ROWS> a;
  MetaTile<A_ROWS> meta;
};

// The rowsel bytes of one row for one stage (BK / V segments), as one word.
template <int SEGS> struct SelWordOf { using type = unsigned; };
template <> struct SelWordOf<1> { using type = uint8_t; };
template <> struct SelWordOf<2> { using type = uint16_t; };

// A stage's row selections (samoyeds): byte j * A_ROWS + r is segment j of block row r (rows in the block's slab
// order), copied with the stage's other tiles, 16 rows per cp.async, instead of being loaded from global memory by
// the MMA threads (whose loads, one byte per row and stage, one stage ahead, were 12-40% of the ws kernel's MMA
// warp time on the H100: ncu, Mixtral T = 4096). Slab s holds rows slab_start(s) .. + SLAB of the expert.
template <int SEGS, int A_ROWS> struct SelTile {
  static constexpr int CHUNKS = SEGS * A_ROWS / 16;  // 16-byte copies per stage
  uint8_t byte[SEGS * A_ROWS];
  // Where copying thread i < CHUNKS reads the first stage of an item from, and writes to (offset in the tile);
  // a later stage kt reads at src + kt * SEGS * R. expert_sel: the expert's rowsel (segment-major), seg0: the
  // first segment the block takes.
  template <int SLAB, typename F>
  static __device__ __forceinline__ const uint8_t* source(const uint8_t* expert_sel, int R, int seg0, int i,
                                                          F slab_start, int& dst) {
    const int j = i / (A_ROWS / 16), r = (i % (A_ROWS / 16)) * 16;
    dst = j * A_ROWS + r;
    return expert_sel + (size_t)(seg0 + j) * R + slab_start(r / SLAB) + r % SLAB;
  }
};

// ------------------------------------------------------------------------------------------ routing index
// One block, before the GEMMs (at least one thread per expert, one per slot up to 1024: kernels.py), with two
// helper kernels over many blocks for large batches (below).
// Counting-sorts the (token, j) slots by expert and cuts each expert's slots into tiles of at most bn slots (one
// map for both GEMMs); unused tiles get rows = 0. The order of slots inside an expert is whatever the atomics
// give: every slot's result depends only on its own token and expert, so the layer's output is still bit-for-bit
// deterministic. Slots routed to an expert on another rank (id outside [0, E), expert parallelism) get no tile;
// sum_slots skips them.

constexpr int MAX_EXPERTS = 1024;

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
// experts in order; tiles past the last one get rows = 0.
__device__ void write_tiles(int* tile_expert, int* tile_start, int* tile_rows, int bn, int num_tiles,
                            const int* counts, int* tile_end, int* warp_sums, const int* first, int E) {
  const int e = threadIdx.x;
  const int tiles = e < E ? (counts[e] + bn - 1) / bn : 0;
  int total;
  const int before = block_exclusive_scan(tiles, warp_sums, total);
  if (e < E) tile_end[e] = before + tiles;
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
      tile_expert[t] = lo;
      tile_start[t] = first[lo] + local * bn;
      tile_rows[t] = rows < bn ? rows : bn;
    } else {
      tile_expert[t] = 0;
      tile_start[t] = 0;
      tile_rows[t] = 0;
    }
  }
}

// f(slot, expert) for every slot in [begin, end) routed to this rank's experts, spread over the block with
// ROUTE_ILP loads in flight per thread.
constexpr int ROUTE_ILP = 8;
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
__device__ void place_slots(const long long* __restrict__ topk_ids, int begin, int end, int E, int* cursor,
                            int* __restrict__ sorted_slot) {
  for_each_slot(topk_ids, begin, end, E,
                [cursor, sorted_slot](int s, int e) { sorted_slot[atomicAdd(&cursor[e], 1)] = s; });
}

// Large batches: one block's shared-memory atomics on E counters cap the index at about one slot per clock (ncu,
// H100, 131,072 slots: 144 µs), so the counting and the scatter run over many blocks, each taking a chunk of
// `chunk` slots: count_slots writes each chunk's per-expert counts, build_routing_index turns them into each
// chunk's first sorted position per expert, scatter_slots places the chunk's slots from there.
__global__ void __launch_bounds__(256) count_slots(const long long* __restrict__ topk_ids, int slots, int E,
                                                   int chunk, int* __restrict__ chunk_counts /* [chunks, E] */) {
  __shared__ int counts[MAX_EXPERTS];
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int begin = blockIdx.x * chunk, end = min(begin + chunk, slots);
  count_slots_into(topk_ids, begin, end, E, counts);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[(size_t)blockIdx.x * E + e] = counts[e];
}

__global__ void __launch_bounds__(256) scatter_slots(const long long* __restrict__ topk_ids, int slots, int E,
                                                     int chunk, const int* __restrict__ chunk_first,
                                                     int* __restrict__ sorted_slot) {
  __shared__ int cursor[MAX_EXPERTS];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cursor[e] = chunk_first[(size_t)blockIdx.x * E + e];
  __syncthreads();
  const int begin = blockIdx.x * chunk, end = min(begin + chunk, slots);
  place_slots(topk_ids, begin, end, E, cursor, sorted_slot);
}

// chunks = 0: counts and scatters the slots itself (decode and small batches: one launch). chunks > 0: sums the
// chunk counts of count_slots and overwrites them with each chunk's first sorted position per expert, for
// scatter_slots to run next.
__global__ void __launch_bounds__(1024, 1) build_routing_index(
    const long long* __restrict__ topk_ids,  // [slots]
    int slots, int E,
    int* __restrict__ sorted_slot,           // [slots] original slot per sorted position
    int* __restrict__ chunk_counts, int chunks,
    int* tile_expert, int* tile_start, int* tile_rows, int bn, int num_tiles) {  // the tile map of both GEMMs
  __shared__ int counts[MAX_EXPERTS], first[MAX_EXPERTS], cursor[MAX_EXPERTS], tile_end[MAX_EXPERTS];
  __shared__ int warp_sums[32];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int total = 0;
    for (int c = 0; c < chunks; ++c) total += chunk_counts[(size_t)c * E + e];
    counts[e] = total;
  }
  __syncthreads();
  if (chunks == 0) count_slots_into(topk_ids, 0, slots, E, counts);
  __syncthreads();
  int total;
  const int e = threadIdx.x;
  const int start = block_exclusive_scan(e < E ? counts[e] : 0, warp_sums, total);
  if (e < E) first[e] = cursor[e] = start;
  __syncthreads();
  if (chunks == 0) {
    place_slots(topk_ids, 0, slots, E, cursor, sorted_slot);
  } else if (e < E) {
    int position = first[e];
    for (int c = 0; c < chunks; ++c) {
      const int n = chunk_counts[(size_t)c * E + e];
      chunk_counts[(size_t)c * E + e] = position;
      position += n;
    }
  }
  write_tiles(tile_expert, tile_start, tile_rows, bn, num_tiles, counts, tile_end, warp_sums, first, E);
}

// ------------------------------------------------------------------------------------------- GEMM epilogue

// Writes one warp's accumulators: acc[h][j][i] is condensed row crow[h] + g + 8 (i / 2) of m tile h (for GATE_UP
// a row of the gate half, h = 0 gate, 1 up) and tile column 8 j + 2 t + i % 2; samoyeds: even / odd are output rows
// 2 crow and 2 crow + 1. GATE_UP: act = SiLU(gate) * up by sorted position; else the routing-weighted row by
// original slot. With split-K (gridDim.z > 1) the raw fp32 sums go to `partial` and the split epilogues finish.
// slot_at(n): the output row of token column n (-1: padding), weight_at(n, slot): its routing weight (GATE_UP
// stores no weight).
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
  // GEMM 2's time there; the ws kernel takes them from shared memory).
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
        weight_of[j][c] = GATE_UP ? 1.0f : weight_at((j0 + j) * 8 + 2 * t + c, slot_of[j][c]);
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

// --------------------------------------------------------------------------------------------- the kernel

// A block has WARPS = 4 or 8 warps; each warp owns MT m16 tiles of weight rows (the same 16 rows of gate and of up
// for GATE_UP, so MT = 2 there; two stacked 16-row tiles for GEMM 2 on wide batches) and all BN tokens of the
// token tile, so every B fragment read from shared memory feeds MT mma.sp. The block's A tile is MT slabs of
// BM = WARPS * 16 rows.
// WGMMA (sm_90a, BN = 64, whole warpgroups): each k-step is one wgmma.mma_async.sp per m tile and warpgroup
// instead of NT mma.sp per warp, with B read by the tensor cores from shared memory (no ldmatrix for B).
template <typename T, bool SAMOYEDS, int V, int BN, bool GATE_UP, int WARPS, int MT, bool WGMMA>
__global__ void __launch_bounds__(WARPS * 32) moe_gemm(
    const T* __restrict__ x,               // GATE_UP: [tokens, K] activations; else [slots, K] act in sorted order
    const T* __restrict__ values,          // [E, R, K/2]
    const int16_t* __restrict__ meta,      // [E, R, K/16]
    const uint8_t* __restrict__ rowsel,    // [E, R, K/V] stored segment-major (samoyeds) or null
    T* __restrict__ out,                   // GATE_UP: act [slots, N_out]; else y [slots, N_out] by original slot
    float* __restrict__ partial,           // split-K (gridDim.z > 1): fp32 partial sums instead of `out`:
                                           //   GATE_UP [z, slots, 2 N_out] (gate | up), else [z, slots, N_out]
    const int* __restrict__ tile_expert,   // [num_tiles]
    const int* __restrict__ tile_start,    // [num_tiles] sorted position of the tile's first slot
    const int* __restrict__ tile_rows,     // [num_tiles] slots in the tile (0: no work)
    const int* __restrict__ sorted_slot,   // [slots] original slot (token * top_k + j) in expert order
    const float* __restrict__ slot_weight, // [slots] routing weight by original slot (GEMM 2)
    int R,                                 // packed rows per expert (both halves for GATE_UP)
    int K,                                 // dense inputs
    int top_k,
    int N_out,                             // output features (row stride of out)
    int slots) {                           // slots in the batch (row count of `partial` per split)
  static_assert(!GATE_UP || MT == 2, "GATE_UP pairs one gate tile with one up tile");
  static_assert(BK % V == 0 && V % 32 == 0, "a segment is whole k-steps of one stage");
  static_assert(!WGMMA || (BN == 64 && WARPS % 4 == 0), "wgmma: m64n64 per warpgroup");
  constexpr int THREADS = WARPS * 32;
  constexpr int BM = WARPS * 16;           // condensed rows per slab
  using StageT = Stage<BN, MT * BM>;
  constexpr int A_ROWS = MT * BM;
  constexpr int NT = BN / 8;               // n8 tiles per warp
  constexpr int SEGS = BK / V;             // row-selection segments per stage (samoyeds)
  constexpr int SEG_STEPS = V / 32;        // k-steps per segment
  using SelWord = typename SelWordOf<SEGS>::type;
  using SelT = SelTile<SAMOYEDS ? SEGS : 1, SAMOYEDS ? A_ROWS : 16>;

  const int tile = blockIdx.y;
  const int n_rows = tile_rows[tile];
  if (n_rows == 0) return;
  const int expert = tile_expert[tile];
  const int first = tile_start[tile];
  const int half_rows = GATE_UP ? R / 2 : R;
  const int row0 = blockIdx.x * (GATE_UP ? BM : A_ROWS);  // first condensed row (within the gate half for GATE_UP)
  const int slab_rows = GATE_UP ? half_rows : BM;          // row distance between the slabs (gate -> up, or stacked)

  extern __shared__ __align__(16) unsigned char smem_raw[];  // STAGES stages + 1 KB to align them
  StageT* stages = reinterpret_cast<StageT*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  __shared__ int token_row[BN];            // row of x holding each tile column (-1: padding)
  __shared__ __align__(16) SelT sel_tiles[STAGES];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  if (tid < BN) {
    int pos = first + tid;
    token_row[tid] = tid < n_rows ? (GATE_UP ? sorted_slot[pos] / top_k : pos) : -1;
  }
  __syncthreads();

  const size_t expert_rows = (size_t)expert * R;
  // Split-K: block z of gridDim.z takes an equal share of the k tiles (more, shorter blocks for small batches).
  const int k_total = K / BK;
  const int kt_begin = (int)((long long)k_total * blockIdx.z / gridDim.z);
  const int k_tiles = (int)((long long)k_total * (blockIdx.z + 1) / gridDim.z) - kt_begin;

  // Per-thread copy addresses, fixed for the whole k loop (a stage only adds its k offset). A: chunk c = tid % 8
  // of rows tid / 8 + j * THREADS / 8, j < 4 per slab, so the XOR swizzle (row & 7) is the same for every j.
  constexpr int A_STEP = THREADS / 8;      // rows between a thread's A chunks
  static_assert(BM == 4 * A_STEP, "four A chunks per thread and slab");
  const int a_row = tid >> 3, a_chunk = tid & 7;
  const T* a_src = values + (expert_rows + row0 + a_row) * (K / 2) + (size_t)kt_begin * (BK / 2) + a_chunk * 8;
  const size_t a_step = (size_t)A_STEP * (K / 2), a_slab = (size_t)slab_rows * (K / 2);
  const int a_dst = a_row * 8 + (a_chunk ^ (a_row & 7));
  // meta: one 16-byte chunk (the 128 inputs of a stage) per row; thread r < A_ROWS copies row r.
  const int m_slab = tid / BM;
  const int16_t* m_src = meta + (expert_rows + row0 + (tid % BM) + (size_t)m_slab * slab_rows) * (K / 16) +
                         (size_t)kt_begin * (BK / 16);
  // B: chunk tid % 16 of token columns tid / 16 + j * THREADS / 16, gathered through the routing index.
  constexpr int B_STEP = THREADS / 16;
  constexpr int B_ITERS = (BN + B_STEP - 1) / B_STEP;
  const int b_col = tid >> 4, b_chunk = tid & 15;
  // rowsel (samoyeds): thread tid < SelT::CHUNKS copies 16 rows of one segment per stage (its address made at
  // each stage: held for the whole loop it made ptxas spill in the decode tiles).
  const int n_seg = K / V;

  auto load_stage = [&](int slot, int kt) {
    StageT& s = stages[slot];
    const size_t k_off = (size_t)kt * BK;
#pragma unroll
    for (int h = 0; h < MT; ++h)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        cp_async16(&s.a.chunk[a_dst + (h * BM + j * A_STEP) * 8], a_src + h * a_slab + j * a_step + k_off / 2, 16);
    if (tid < A_ROWS) cp_async16(&s.meta.half[tid * 8], m_src + k_off / 16, 16);
    if (SAMOYEDS && tid < SelT::CHUNKS) {
      int sel_dst;
      const uint8_t* sel_src =
          SelT::template source<BM>(rowsel + (size_t)expert * n_seg * R, R, (kt_begin + kt) * SEGS, tid,
                                    [&](int h) { return row0 + h * slab_rows; }, sel_dst);
      cp_async16(&sel_tiles[slot].byte[sel_dst], sel_src, 16);
    }
#pragma unroll
    for (int j = 0; j < B_ITERS; ++j) {
      const int n = b_col + j * B_STEP;
      if (B_ITERS * B_STEP > BN && n >= BN) break;
      const int src_row = token_row[n];
      const T* src = x + (size_t)(src_row < 0 ? 0 : src_row) * K + (size_t)(kt_begin + kt) * BK + b_chunk * 8;
      cp_async16(&s.b.chunk[BTile<BN>::at(n, b_chunk)], src, src_row < 0 ? 0 : 16);
    }
  };

  // Accumulators: [m tile][n8 tile][4]. For samoyeds, one per row of the pair (see the fold below).
  float acc[MT][NT][4] = {};
  float acc_odd[MT][NT][4] = {};   // unused (optimised away) for 2:4

  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  const int wrow0 = warp * 16;  // this warp's first row inside a slab
  // Samoyeds fold: fold_segment before each segment (kept_odd[h][r] for rows g and g + 8 of tile h), with the
  // stage's row selections from its SelTile.
  bool kept_odd[MT][2] = {};
  int sel_rows[MT];
#pragma unroll
  for (int h = 0; h < MT; ++h) sel_rows[h] = h * BM + wrow0 + g;

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    if constexpr (WGMMA) fence_proxy_async();
    __syncthreads();
    SelWord sel[MT][2];
    if constexpr (SAMOYEDS) stage_sel<MT, SEGS, A_ROWS>(sel, sel_tiles[kt % STAGES].byte, sel_rows);
    if (kt + STAGES - 1 < k_tiles) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();
    const StageT& s = stages[kt % STAGES];

#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (SAMOYEDS && ks % SEG_STEPS == 0) {  // a segment starts: bring the kept rows' accumulators in place
        if (WGMMA && ks > 0) wgmma_drain(acc);  // V < 128: the segment before, in this stage, must finish first
        fold_segment(acc, acc_odd, sel, kept_odd, ks / SEG_STEPS);
      }
      unsigned a[MT][4], e[MT];
#pragma unroll
      for (int h = 0; h < MT; ++h) {
        const int r = h * BM + wrow0 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int c = ks * 2 + (lane >> 4);
        ldmatrix_x4(a[h], &s.a.chunk[r * 8 + (c ^ (r & 7))]);
        const int mr = h * BM + wrow0 + g;
        e[h] = (unsigned)s.meta.half[mr * 8 + ks * 2 + (t & 1)] |
               ((unsigned)s.meta.half[(mr + 8) * 8 + ks * 2 + (t & 1)] << 16);
      }
      if constexpr (WGMMA) {
#pragma unroll
        for (int h = 0; h < MT; ++h) wgmma_pin(acc[h]);
        wgmma_fence();
        // k-step ks: inputs 32 ks.. of the stage, from byte 64 (ks % 2) of the rows of panel ks / 2 (row 0 is
        // unswizzled, so its chunk 4 (ks % 2) is that address; the tensor cores apply the swizzle to the rest).
        const unsigned long long desc = sw128_desc(&s.b.chunk[BTile<BN>::at(0, ks * 4)]);
#pragma unroll
        for (int h = 0; h < MT; ++h) wgmma_sp_n64<T>(acc[h], a[h], desc, e[h]);
      } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          unsigned b[4];
          const int n = j * 8 + (lane & 7);
          const int c = ks * 4 + (lane >> 3);
          ldmatrix_x4(b, &s.b.chunk[BTile<BN>::at(n, c)]);
#pragma unroll
          for (int h = 0; h < MT; ++h) mma_sp<T>(acc[h][j], a[h], b, e[h]);
        }
      }
    }
    if constexpr (WGMMA) wgmma_drain(acc);  // before the stage's shared memory is refilled or d is read
  }
  cp_async_wait<0>();
  if constexpr (SAMOYEDS) unfold(acc, acc_odd, kept_odd);
  int crow[MT];
#pragma unroll
  for (int h = 0; h < MT; ++h) crow[h] = row0 + (GATE_UP ? 0 : h * BM) + wrow0;
  store_tile<T, SAMOYEDS, GATE_UP>(
      acc, acc_odd, crow, lane,
      [&](int n) { return n >= n_rows ? -1 : GATE_UP ? first + n : sorted_slot[first + n]; },
      [&](int, int slot) { return slot < 0 ? 1.0f : slot_weight[slot]; }, out, partial, N_out, slots);
}

// ------------------------------------------------------------------------- warp-specialised kernel (sm_90a)

// Wide token tiles on Hopper. Warpgroup 0 copies (cp.async: the weight tiles, and the tokens gathered through the
// routing index), two MMA warpgroups multiply: each owns MT = 2 m64 tiles of condensed weight rows (the same 64
// rows of gate and of up for GATE_UP, two stacked 64-row slabs for GEMM 2) and shares the block's B tile of BN
// tokens (64; 128 for 2:4, which keeps one accumulator set).
// Stages pass between them through mbarriers (full: the copies landed; empty: the wgmmas that read a stage are
// done), so the copies of later stages run while the tensor cores work, and the two MMA warpgroups overlap one's
// fold and drain with the other's wgmmas. A and B are both read by the tensor cores from the 128-byte-swizzled
// tiles through descriptors; only the metadata passes through registers. The blocks are persistent (one per SM),
// so the copier fills the next work item's stages while the MMA warpgroups run an epilogue.
namespace ws {
constexpr int CONSUMERS = 2;             // MMA warpgroups per block
constexpr int THREADS = 128 * (CONSUMERS + 1);
// Pipeline depth by token-tile width: 4 x 52 KB (64 tokens) or 3 x 68 KB (128) of shared memory, one block per
// SM; each stage is handed over by the arrivals its copies trigger when they land, so every free stage is in flight.
template <int BN> constexpr int STAGES = BN == 64 ? 4 : 3;
// Registers per thread after setmaxnreg: the block's launch allocation (384 threads x the launch-bounds cap of
// 168) split between the roles; ptxas spills least with these (nvcc 13.0).
constexpr int COPY_REGS = 64;
constexpr int MMA_REGS = 216;
// GEMMs of many row blocks (large experts) take their work items in groups of TILE_GROUP token tiles, row block
// outer, tile inner: the ~132 blocks running at one time take ~8 row blocks of one group of tiles, so each weight
// row block is read from DRAM about once per group and the group's tokens stay in L2. Row block inner, the blocks
// running at one time spanned all row blocks of ~2 tiles, and a Mixtral expert's 66 MB of gate/up weights left L2
// before the next tiles came (ncu: GEMM 1 at 70% of DRAM bandwidth at T = 4096); grouped, Mixtral's layer was
// 6-10% faster (H100). With few row blocks (Qwen3: 3 and 4) an expert's weights stay in L2 either way, and the
// groups measured 2% slower at T = 16384, so those keep row block inner (a group of one tile).
constexpr int TILE_GROUP = 16;
constexpr int GROUPED_FROM_ROW_BLOCKS = 8;
}  // namespace ws

// What the copier tells the MMA warpgroups about their next work item, through a ring of two passed like the stages
// (item_full / item_empty mbarriers), so that they read no global memory themselves: the row block, and each token
// column's output row and routing weight for the epilogue, which the copier reads while it runs ahead (as dependent
// global loads at the start and in the epilogue of each item they were ~45% of the MMA warps' time in Qwen3's GEMM 2
// at T = 16384, ncu, H100). n_rows = -1: no more items.
template <int BN> struct ItemInfo {
  int slot[BN];      // output row of each token column (GATE_UP: its sorted position); -1 for padding
  float weight[BN];  // routing weight of each column (1 for GATE_UP)
  int row_block, n_rows;
};

template <typename T, bool SAMOYEDS, int V, int BN, bool GATE_UP>
__global__ void __launch_bounds__(ws::THREADS, 1) moe_gemm_ws(
    const T* __restrict__ x, const T* __restrict__ values, const int16_t* __restrict__ meta,
    const uint8_t* __restrict__ rowsel, T* __restrict__ out, float* __restrict__ partial,
    const int* __restrict__ tile_expert, const int* __restrict__ tile_start, const int* __restrict__ tile_rows,
    const int* __restrict__ sorted_slot, const float* __restrict__ slot_weight, int R, int K, int top_k, int N_out,
    int slots,            // the arguments of moe_gemm, then:
    int row_blocks,       // blocks of 128 condensed rows (per half for GATE_UP)
    int num_tiles) {      // token tiles in the tile map
  using ws::CONSUMERS;
  static_assert(BN == 64 || (BN == 128 && !SAMOYEDS), "samoyeds keeps two accumulator sets: 64 tokens fit");
  constexpr int MT = 2, NT = BN / 8, SLAB = 64;
  constexpr int SLABS = CONSUMERS * MT;
  constexpr int A_ROWS = SLABS * SLAB;
  constexpr int STAGES_WS = ws::STAGES<BN>;
  constexpr int SEGS = BK / V, SEG_STEPS = V / 32;
  using StageT = Stage<BN, A_ROWS>;
  using SelWord = typename SelWordOf<SEGS>::type;
  using SelT = SelTile<SAMOYEDS ? SEGS : 1, SAMOYEDS ? A_ROWS : 16>;
  static_assert(BK % V == 0 && V % 32 == 0, "a segment is whole k-steps of one stage");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  StageT* stages = reinterpret_cast<StageT*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  __shared__ __align__(16) SelT sel_tiles[STAGES_WS];
  __shared__ ItemInfo<BN> item_info[2];
  __shared__ unsigned long long full[STAGES_WS], empty[STAGES_WS], item_full[2], item_empty[2];
  // The copier's: row of x for each token column of the item (-1: padding), column b_col + 8 j at [b_col][j], so a
  // copying thread reads the rows of its columns four at a time. With one dependent 4-byte load in front of each
  // B cp.async the copier's issue was what the MMA warpgroups waited for (H100 ncu, 2:4 at T = 4096); this read
  // made the layer 6-9% faster at T = 4096 / 16384.
  __shared__ __align__(16) int token_rows[8][BN / 8];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < STAGES_WS; ++s) {
      mbar_init(&full[s], 128);
      mbar_init(&empty[s], 128 * CONSUMERS);
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(&item_full[s], 128);
      mbar_init(&item_empty[s], 128 * CONSUMERS);
    }
  }
  __syncthreads();

  const int half_rows = GATE_UP ? R / 2 : R;
  const int k_total = K / BK;
  const int kt_begin = (int)((long long)k_total * blockIdx.z / gridDim.z);
  const int k_tiles = (int)((long long)k_total * (blockIdx.z + 1) / gridDim.z) - kt_begin;
  // Slab q = consumer * MT + h of row block rb: its first condensed row in the expert (GATE_UP: h = 1 is up).
  auto slab_row = [&](int rb, int q) {
    const int row0 = rb * CONSUMERS * (GATE_UP ? SLAB : MT * SLAB);
    return GATE_UP ? row0 + (q / MT) * SLAB + (q % MT) * half_rows : row0 + q * SLAB;
  };

  if (warp < 4) {  // ---- the copier warpgroup
    regs_shrink<ws::COPY_REGS>();
    // A: chunk tid % 8 of rows tid / 8 + 16 j (j < 4) of every slab; the XOR swizzle (row & 7) is the same for all.
    // meta: one 16-byte chunk per row and stage, rows tid + 128 i. B: chunk tid % 16 of token columns
    // tid / 16 + 8 j (j < BN / 8), gathered through the routing index. rowsel: one chunk per thread < CHUNKS.
    const int a_row = tid >> 3, a_chunk = tid & 7, b_col = tid >> 4, b_chunk = tid & 15;
    const int a_dst = a_row * 8 + (a_chunk ^ (a_row & 7));
    const int n_seg = K / V;
    int stage = 0;  // stages issued over all items
    int item = 0;   // items handed to the MMA warpgroups
    // Persistent blocks walk the work items (token tile, row block) in TILE_GROUP order. The copier skips the
    // empty tiles, hands each item to the MMA warpgroups through item_info, and counts stages over all items: it
    // runs ahead into the next item while the MMA warpgroups run an epilogue.
    const int tile_group = row_blocks >= ws::GROUPED_FROM_ROW_BLOCKS ? ws::TILE_GROUP : 1;
    for (int w = blockIdx.x; w < row_blocks * num_tiles; w += gridDim.x) {
      const int group = w / (tile_group * row_blocks), in_group = w % (tile_group * row_blocks);
      const int group_tiles = min(tile_group, num_tiles - group * tile_group);
      const int tile = group * tile_group + in_group % group_tiles, rb = in_group / group_tiles;
      const int n_rows = tile_rows[tile];
      if (n_rows == 0) continue;
      const int expert = tile_expert[tile];
      const size_t expert_rows = (size_t)expert * R;
      const int first = tile_start[tile];
      // One base address each for A and meta; the slabs sit at fixed row offsets from the first (few registers
      // here: the copier runs on COPY_REGS).
      const T* a_src = values + (expert_rows + slab_row(rb, 0) + a_row) * (K / 2) + (size_t)kt_begin * (BK / 2) +
                       a_chunk * 8;
      const int16_t* m_src = meta + (expert_rows + slab_row(rb, tid / SLAB) + tid % SLAB) * (K / 16) +
                             (size_t)kt_begin * (BK / 16);
      auto slab_offset = [&](int q) { return slab_row(rb, q) - slab_row(rb, 0); };
      int sel_dst = 0;
      const uint8_t* sel_src =
          SAMOYEDS && tid < SelT::CHUNKS
              ? SelT::template source<SLAB>(rowsel + (size_t)expert * n_seg * R, R, kt_begin * SEGS, tid,
                                            [&](int q) { return slab_row(rb, q); }, sel_dst)
              : nullptr;
      ItemInfo<BN>& info = item_info[item & 1];
      if (item >= 2) mbar_wait(&item_empty[item & 1], ((item >> 1) - 1) & 1);
      copier_sync();  // every copier thread is done with the last item's token rows
      if (tid < BN) {  // column tid is entry j = tid / 8 of the rows of b_col = tid % 8 (see token_rows)
        int row = -1, slot = -1;
        float weight = 1.0f;
        if (tid < n_rows) {
          const int pos = first + tid;
          if (GATE_UP) {
            row = sorted_slot[pos] / top_k;
            slot = pos;
          } else {
            row = pos;
            slot = sorted_slot[pos];
            weight = slot_weight[slot];
          }
        }
        token_rows[tid % 8][tid / 8] = row;
        info.slot[tid] = slot;
        info.weight[tid] = weight;
      }
      if (tid == 0) info.row_block = rb, info.n_rows = n_rows;
      mbar_arrive(&item_full[item & 1]);
      ++item;
      copier_sync();
      const T* b_src = x + (size_t)kt_begin * BK + b_chunk * 8;
      for (int kt = 0; kt < k_tiles; ++kt, ++stage) {
        const int slot = stage % STAGES_WS;
        if (stage >= STAGES_WS) mbar_wait(&empty[slot], (stage / STAGES_WS - 1) & 1);
        StageT& s = stages[slot];
#pragma unroll
        for (int q = 0; q < SLABS; ++q)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            cp_async16(&s.a.chunk[a_dst + (q * SLAB + 16 * j) * 8],
                       a_src + (slab_offset(q) + 16 * j) * (K / 2) + kt * (BK / 2), 16);
#pragma unroll
        for (int i = 0; i < A_ROWS / 128; ++i)  // row tid + 128 i: slab tid / 64 + 2 i
          cp_async16(&s.meta.half[(tid + 128 * i) * 8],
                     m_src + (slab_offset(tid / SLAB + 2 * i) - slab_offset(tid / SLAB)) * (K / 16) +
                         kt * (BK / 16),
                     16);
        if (SAMOYEDS && tid < SelT::CHUNKS)
          cp_async16(&sel_tiles[slot].byte[sel_dst], sel_src + (size_t)kt * SEGS * R, 16);
#pragma unroll
        for (int q = 0; q < BN / 32; ++q) {
          const int4 rows = *reinterpret_cast<const int4*>(&token_rows[b_col][4 * q]);
          const int row[4] = {rows.x, rows.y, rows.z, rows.w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
            cp_async16(&s.b.chunk[BTile<BN>::at(b_col + 8 * (4 * q + i), b_chunk)],
                       b_src + (size_t)(row[i] < 0 ? 0 : row[i]) * K + kt * BK, row[i] < 0 ? 0 : 16);
        }
        mbar_arrive_on_copies(&full[slot]);  // the stage is full once all 128 threads' copies landed
      }
    }
    if (item >= 2) mbar_wait(&item_empty[item & 1], ((item >> 1) - 1) & 1);
    if (tid == 0) item_info[item & 1].n_rows = -1;
    mbar_arrive(&item_full[item & 1]);
    cp_async_commit();
    cp_async_wait<0>();
  } else {  // ---- an MMA warpgroup
    regs_grow<ws::MMA_REGS>();
    const int consumer = warp / 4 - 1, wrow0 = (warp & 3) * 16;
    const int g = lane >> 2, t = lane & 3;
    int sel_rows[MT];  // row g of each m tile in the block's row order (SelTile)
#pragma unroll
    for (int h = 0; h < MT; ++h) sel_rows[h] = (consumer * MT + h) * SLAB + wrow0 + g;
    int stage = 0;
    for (int item = 0;; ++item) {
      mbar_wait(&item_full[item & 1], (item >> 1) & 1);
      const ItemInfo<BN>& info = item_info[item & 1];
      const int n_rows = info.n_rows, rb = info.row_block;
      if (n_rows < 0) break;
      float acc[MT][NT][4] = {};
      float acc_odd[MT][NT][4] = {};  // samoyeds only: the odd rows' share (fold_segment)
      bool kept_odd[MT][2] = {};

      for (int kt = 0; kt < k_tiles; ++kt, ++stage) {
        const int slot = stage % STAGES_WS;
        mbar_wait(&full[slot], (stage / STAGES_WS) & 1);
        fence_proxy_async();  // the copies wrote through the generic proxy, the wgmmas read through the async one
        const StageT& s = stages[slot];
        SelWord sel[MT][2];
        if constexpr (SAMOYEDS) stage_sel<MT, SEGS, A_ROWS>(sel, sel_tiles[slot].byte, sel_rows);
        // Metadata of the warp's rows g and g + 8 for the stage's 4 k-steps: one 16-byte row each, and k-step ks
        // takes halfword 2 ks + (t & 1) of both (lanes 4g, 4g + 1 carry inputs 0-15 and 16-31 of the step).
        unsigned e[MT][4];
#pragma unroll
        for (int h = 0; h < MT; ++h) {
          const int mr = (consumer * MT + h) * SLAB + wrow0 + g;
          const uint4 lo = *reinterpret_cast<const uint4*>(&s.meta.half[mr * 8]);
          const uint4 hi = *reinterpret_cast<const uint4*>(&s.meta.half[(mr + 8) * 8]);
          const unsigned pick = (t & 1) ? 0x7632 : 0x5410;
          e[h][0] = __byte_perm(lo.x, hi.x, pick);
          e[h][1] = __byte_perm(lo.y, hi.y, pick);
          e[h][2] = __byte_perm(lo.z, hi.z, pick);
          e[h][3] = __byte_perm(lo.w, hi.w, pick);
        }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          if (ks % SEG_STEPS == 0) {  // a segment starts (2:4: the stage)
            if constexpr (SAMOYEDS) {
              if (ks > 0) wgmma_drain(acc);  // V < 128: the segment before, in this stage, must finish first
              fold_segment(acc, acc_odd, sel, kept_odd, ks / SEG_STEPS);
            }
#pragma unroll
            for (int h = 0; h < MT; ++h) wgmma_pin(acc[h]);
            wgmma_fence();
          }
          // k-step ks: 16 compressed values (32 B) into each A row, 32 inputs (64 B) into the B rows of panel
          // ks / 2; row 0 of each tile is unswizzled, so those are the start addresses.
          const unsigned long long b_desc = sw128_desc(&s.b.chunk[BTile<BN>::at(0, ks * 4)]);
#pragma unroll
          for (int h = 0; h < MT; ++h)
            wgmma_sp_ss<T, BN>(acc[h], sw128_desc(&s.a.chunk[(consumer * MT + h) * SLAB * 8 + ks * 2]),
                               b_desc, e[h][ks]);
        }
        wgmma_drain(acc);
        mbar_arrive(&empty[slot]);
      }
      if constexpr (SAMOYEDS) unfold(acc, acc_odd, kept_odd);
      int crow[MT];
#pragma unroll
      for (int h = 0; h < MT; ++h) crow[h] = slab_row(rb, consumer * MT + (GATE_UP ? 0 : h)) + wrow0;
      store_tile<T, SAMOYEDS, GATE_UP>(
          acc, acc_odd, crow, lane, [&](int n) { return info.slot[n]; },
          [&](int n, int) { return info.weight[n]; }, out, partial, N_out, slots);
      mbar_arrive(&item_empty[item & 1]);
    }
  }
}

// ------------------------------------------------------------------------------------- split-K epilogues

// act[pos, i] = SiLU(sum_z gate[z, pos, i]) * sum_z up[z, pos, i]
template <typename T>
__global__ void silu_mul_splits(const float* __restrict__ partial, T* __restrict__ act, int splits, int slots,
                                int inter) {
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
// it is latency-bound and more threads do better (kernels.py picks; hidden is a multiple of 64).
template <typename T, typename SRC, int VEC>
__global__ void sum_slots(const SRC* __restrict__ src, const long long* __restrict__ topk_ids, int E,
                          T* __restrict__ out, int splits, int tokens, int top_k, int hidden) {
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
