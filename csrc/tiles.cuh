// Shared-memory tiles of one pipeline stage, and the pieces of the k loop both GEMM kernels share.
//
// A tile: rows x 64 compressed values (128 B = 8 chunks of 16 B); chunk c of row r lives at c ^ (r & 7), so the
// 8 rows one ldmatrix reads fall in 8 different bank groups, and it is the 128-byte-swizzled K-major layout that
// wgmma reads through a descriptor (sw128_desc). FP8 values take 64 B per row and stage, unswizzled, in the
// fragment order of fp8_fragment (below). B tile: BN tokens x 128 inputs in two 64-input panels
// (BTile::at), the same XOR inside each panel. Meta tile: rows x 8 halfwords (the metadata of 128 dense inputs),
// unswizzled (read as scalars or 16-byte rows). Sel tile (samoyeds): the stage's row selections.
#pragma once

#include "config.cuh"
#include "ptx.cuh"

namespace samoyeds {

template <int ROWS> struct ATile { uint4 chunk[ROWS * 8]; };
template <int BN> struct BTile {
  uint4 chunk[BN * 16];
  // Chunk c (8 inputs) of token row n: two panels of 64 inputs, rows 128 B apart, chunk c % 8 of a row
  // at (c % 8) ^ (n % 8): the 128-byte-swizzled K-major layout wgmma reads, and conflict-free for ldmatrix.
  static __device__ __forceinline__ int at(int n, int c) { return (c >> 3) * BN * 8 + n * 8 + ((c & 7) ^ (n & 7)); }
};
// FP8 activations: BN tokens x 128 one-byte inputs, one 128-byte row per token (chunk c: 16 inputs), the same
// swizzle, so a 64-input k-step starts at chunk 4 j of row 0.
template <int BN> struct BTile8 {
  uint4 chunk[BN * 8];
  static __device__ __forceinline__ int at(int n, int c) { return n * 8 + (c ^ (n & 7)); }
};
template <int ROWS> struct MetaTile { uint16_t half[ROWS * 8]; };

// A_ROWS: all weight rows of the block (gate rows then up rows for GATE_UP); VALUE_BYTES: 2, or 1 for FP8 values,
// whose rows of 64 one-byte values fill A_ROWS / 2 rows of 128 B; ACT8: the tokens are FP8 too (BTile8).
template <int BN, int A_ROWS, int VALUE_BYTES = 2, bool ACT8 = false>
struct Stage {  // every member a multiple of 1 KB for A_ROWS % 64 == 0, so b stays 1 KB aligned (wgmma swizzle atoms)
  typename Pick<ACT8, BTile8<BN>, BTile<BN>>::type b;
  ATile<A_ROWS * VALUE_BYTES / 2> a;
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

// FP8 values: the A fragment of k-step ks (mma.sp m16n8k32: a[0] row g, compressed columns 2t, 2t + 1; a[1] row
// g + 8, the same; a[2], a[3] columns 2t + 8, 2t + 9) from this thread's 16 bytes of rows g and g + 8
// (rows[0], rows[1]), for mma.sp and for wgmma.sp with A in registers. kernels/weights.py stores each row's 64
// values of a stage in the order (t, ks, the four columns), so the 4 bytes of one k-step are word ks of the chunk:
// one 16-byte shared load per row and stage instead of ldmatrix, which moves 16-bit elements.
template <typename T>
__device__ __forceinline__ void fp8_fragment(unsigned (&a)[4], const uint4 (&rows)[2], int ks) {
  const unsigned g_row = ks == 0 ? rows[0].x : ks == 1 ? rows[0].y : ks == 2 ? rows[0].z : rows[0].w;
  const unsigned g8_row = ks == 0 ? rows[1].x : ks == 1 ? rows[1].y : ks == 2 ? rows[1].z : rows[1].w;
  a[0] = fp8x2_to<T, false>(g_row);
  a[1] = fp8x2_to<T, false>(g8_row);
  a[2] = fp8x2_to<T, true>(g_row);
  a[3] = fp8x2_to<T, true>(g8_row);
}

// Where chunk c (of 4) of FP8 row r sits in the ws kernel's A tile: rows of 64 B, the chunks XOR-swizzled by bits
// 1-2 of the row, so the rows g = 0, 2, 4, 6 (which share banks) read by one load spread over the banks instead of
// hitting the same four (4-way conflicts, halved to 2-way for FP8 x FP8's two chunks per row: e4m3_fragment).
__device__ __forceinline__ int fp8_chunk_at(int r, int c) { return c ^ ((r >> 1) & 3); }

// FP8 values and FP8 activations: the A fragment of 64-input k-step j for wgmma_sp_e4m3 (a[0] row g, compressed
// bytes 4t .. 4t + 3 of the step; a[1] row g + 8; a[2], a[3] bytes 16 + 4t ..) from the rows in fp8_fragment's
// order (byte 16 t' + 4 ks + 2 hi + lo is column 8 hi + 2 t' + lo of 32-input step ks). Bytes 4t .. 4t + 3 of the
// step are the halves hi = t >> 1 of the words of chunks (threads) t' = 2 (t & 1) and t' + 1 at ks = 2 j, bytes
// 16 + 4t .. the same at ks = 2 j + 1: rows[r][c] is chunk 2 (t & 1) + c of row g + 8 r, all four k-steps.
// step[r][c]: the half of chunk 2 (t & 1) + c of row g + 8 r that k-step j reads (its first 8 bytes for j = 0, its
// last 8 for j = 1).
__device__ __forceinline__ void e4m3_fragment_of_step(unsigned (&a)[4], const uint2 (&step)[2][2], int t) {
  const unsigned pick = (t >> 1) ? 0x7632 : 0x5410;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    a[r] = __byte_perm(step[r][0].x, step[r][1].x, pick);
    a[2 + r] = __byte_perm(step[r][0].y, step[r][1].y, pick);
  }
}
__device__ __forceinline__ void e4m3_fragment(unsigned (&a)[4], const uint4 (&rows)[2][2], int t, int j) {
  uint2 step[2][2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 2; ++c)
      step[r][c] = j == 0 ? make_uint2(rows[r][c].x, rows[r][c].y) : make_uint2(rows[r][c].z, rows[r][c].w);
  e4m3_fragment_of_step(a, step, t);
}

// Where the weights are in global memory. Packed values and metadata are stored tiled (kernels/weights.py): each
// TILE_ROWS-row tile of an expert's rows holds, stage by stage, its rows' PER elements of that stage (64 values, or
// 8 metadata halfwords), so one stage of a block's rows is whole kilobytes of contiguous memory. Row-major, a row's
// 64 values of a stage sit K / 2 values apart: the decode GEMMs streamed FP8 values (64-byte pieces) at ~1.5 TB/s
// against ~2.2 TB/s for bf16's 128-byte pieces, and tiled FP8 layers ran 15-25% faster at T = 16..256 (H100).
// The offset of (row, stage) for a row counted over all experts (expert * R + r; R is whole tiles).
template <int PER>
__device__ __forceinline__ size_t tiled_offset(size_t row, int stage, int K) {
  return ((row / TILE_ROWS) * (size_t)(K / BK) + stage) * (TILE_ROWS * PER) + (row % TILE_ROWS) * PER;
}

// The dynamic shared memory as an array of stages, 1 KB aligned (the 128-byte swizzle atoms of wgmma are 1 KB);
// the host adds 1 KB to the size for this (kernels/plan.py, stage_bytes).
template <typename StageT>
__device__ __forceinline__ StageT* aligned_stages(unsigned char* smem_raw) {
  return reinterpret_cast<StageT*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
}

// The k tiles (BK inputs each) of one split-K block: block z of gridDim.z takes an equal share, so small batches
// run more, shorter blocks.
struct KRange {
  int begin, count;
  __device__ __forceinline__ explicit KRange(int K) {
    const int total = K / BK;
    begin = (int)((long long)total * blockIdx.z / gridDim.z);
    count = (int)((long long)total * (blockIdx.z + 1) / gridDim.z) - begin;
  }
};

}  // namespace samoyeds
