// The expert GEMM of decode and mid-size batches (and of every batch before Hopper): mma.sp, or on sm_90a with
// 64-token tiles one warpgroup's wgmma.mma_async.sp, in a plain STAGES-deep cp.async pipeline.
//
// Work decomposition:
//   blockIdx.x: MT slabs of BM = WARPS x 16 condensed weight rows (64 to 256 rows): for GATE_UP the same BM rows
//               of gate and of up, so SiLU(gate) * up is computed in registers; for GEMM 2 one or two stacked slabs.
//   blockIdx.y: one token tile: up to BN (token, expert) slots of one expert (routing.cuh). Tiles past the last
//               one have 0 slots and exit at once, so the grid is sized without knowing the routing; experts
//               without tokens have no tiles and cost nothing.
//   blockIdx.z: one share of the k tiles under split-K (fp32 partial sums, finished by reduce.cuh).
//   k loop:     BK = 128 dense inputs per stage, STAGES-deep cp.async pipeline into the XOR-swizzled tiles of
//               tiles.cuh, ldmatrix into exactly the mma.sp fragments (the compressed A tile has the dense m16n8k16
//               layout); with WGMMA the tensor cores read B from shared memory themselves (one wgmma per m tile and
//               k-step).
#pragma once

#include "config.cuh"
#include "epilogue.cuh"
#include "few_tokens.cuh"
#include "fold.cuh"
#include "operands.cuh"
#include "params.cuh"
#include "ptx.cuh"
#include "tiles.cuh"

namespace samoyeds {

// A block has WARPS = 4 or 8 warps; each warp owns MT m16 tiles of weight rows (the same 16 rows of gate and of up
// for GATE_UP, so MT = 2 there; two stacked 16-row tiles for GEMM 2 on wide batches) and all BN tokens of the
// token tile, so every B fragment read from shared memory feeds MT mma.sp. The block's A tile is MT slabs of
// BM = WARPS * 16 rows.
// WGMMA (sm_90a, BN = 64, whole warpgroups): each k-step is one wgmma.mma_async.sp per m tile and warpgroup
// instead of NT mma.sp per warp, with B read by the tensor cores from shared memory (no ldmatrix for B).
// FP8: the values are e4m3 bytes, half the bytes to stream (what bounds decode), turned into exact T fragments in
// registers (fp8_fragment) and scaled per output row in the epilogue; the MMAs stay T x T. That conversion, about
// three instructions a value, made these kernels instruction bound below the bandwidth the bf16 ones reach
// (docs/benchmarks.md, "Why FP8 values stream slower"). ACT8 (FP8 values, Hopper) multiplies FP8 copies of the
// activations instead (quantize.cuh): each warpgroup's 64 rows by e4m3 wgmma.mma_async.sp m64nBNk64 (Hopper has no
// FP8 mma.sync), A from registers straight from the stage (e4m3_fragment_of_step, as the ws kernel's), B (a BTile8)
// read by the tensor cores, each token column's scale applied in the epilogue.
template <typename T, bool FP8, bool SAMOYEDS, int V, int BN, bool GATE_UP, int WARPS, int MT, bool WGMMA, bool ACT8>
__device__ __forceinline__ void moe_gemm_body(
    const typename Pick<ACT8, uint8_t, T>::type* __restrict__ x,  // GATE_UP: [tokens, K] activations; else [slots,
                                                                   // K] act in sorted order (ACT8: e4m3 copies)
    const float* __restrict__ x_scale,     // ACT8: the scale of each row of x (quantize.cuh), else null
    const typename ValueOf<T, FP8>::type* __restrict__ values,  // [E, R, K/2]
    const int16_t* __restrict__ meta,      // [E, R, K/16]
    const uint8_t* __restrict__ rowsel,    // [E, R, K/V] stored segment-major (samoyeds) or null
    const float* __restrict__ scale,       // FP8: [E, output rows] scale of each dense output row
    T* __restrict__ out,                   // GATE_UP: act [slots, N_out]; else y [slots, N_out] by original slot
    float* __restrict__ partial,           // split-K (gridDim.z > 1): fp32 partial sums instead of `out`:
                                           //   GATE_UP [z, slots, 2 N_out] (gate | up), else [z, slots, N_out]
    const int* __restrict__ tiles,         // [num_tiles, 4] expert, first sorted position, slots (0: no work)
    const int* __restrict__ sorted_slot,   // [slots] original slot (token * top_k + j) in expert order
    const float* __restrict__ sorted_weight, // [slots] routing weight by sorted position (GEMM 2)
    const long long* __restrict__ topk_ids, // GEMM 1 of a few tokens: their experts (few_tokens.cuh), else null
    int num_experts,                       // experts of this rank (ids outside [0, num_experts) live elsewhere)
    int R,                                 // packed rows per expert (both halves for GATE_UP)
    int K,                                 // dense inputs
    int top_k,
    int N_out,                             // output features (row stride of out)
    int slots) {                           // slots in the batch (row count of `partial` per split)
  static_assert(!GATE_UP || MT == 2, "GATE_UP pairs one gate tile with one up tile");
  static_assert(BK % V == 0 && V % 32 == 0, "a segment is whole k-steps of one stage");
  static_assert(!WGMMA || (BN == 64 && WARPS % 4 == 0), "wgmma: m64n64 per warpgroup");
  static_assert(!ACT8 || (FP8 && !WGMMA && WARPS % 4 == 0 && V % 64 == 0),
                "FP8 activations: FP8 values, whole warpgroups, segments of whole 64-input k-steps");
  constexpr int THREADS = WARPS * 32;
  constexpr int BM = WARPS * SLAB_ROWS;    // condensed rows per slab
  using StageT = Stage<BN, MT * BM, FP8 ? 1 : 2, ACT8>;
  using BTileT = typename Pick<ACT8, BTile8<BN>, BTile<BN>>::type;
  constexpr int A_ROWS = MT * BM;
  constexpr int NT = BN / 8;               // n8 tiles per warp
  constexpr int SEGS = BK / V;             // row-selection segments per stage (samoyeds)
  constexpr int KSTEPS = ACT8 ? 2 : 4;     // k-steps per stage: 32 inputs (T x T), or 64 (e4m3 x e4m3)
  constexpr int SEG_STEPS = V / (BK / KSTEPS);  // k-steps per segment
  using SelWord = typename SelWordOf<SEGS>::type;
  using SelT = SelTile<SAMOYEDS ? SEGS : 1, SAMOYEDS ? A_ROWS : 16>;

  // GEMM 1's tile map and x come from the kernels just before it; GEMM 2's tile map from the routing index, two or
  // more launches back, so GEMM 2 reads it before waiting for GEMM 1 (ptx.cuh) and streams its first stages'
  // weights meanwhile; it waits before it reads act. Every block waits, those without work too: a grid whose
  // blocks all left before waiting could finish before the kernel before it (a rank of expert parallelism with no
  // slot routed to its experts).
  // A few tokens (topk_ids given: the plan's few_token_map, few_tokens.cuh): GEMM 1 of the narrowest tile works its
  // tile out from topk_ids and waits for the index only before it lets the next kernel start.
  const int tile = blockIdx.y;
  __shared__ int token_row[BN];  // row of x holding each tile column (-1: padding)
  // the kernel the plan picks for it; not with FP8 activations, whose copy of x the kernel before this one writes
  constexpr bool FEW_TOKEN_MAP = GATE_UP && BN == FEW_TOKENS && !WGMMA && !ACT8;
  FewTokenTile own_tile{-1, 0, 0};
  if constexpr (FEW_TOKEN_MAP) {
    if (topk_ids != nullptr) own_tile = few_token_tile<BN>(topk_ids, slots, top_k, num_experts, tile, token_row);
  }
  const bool own = own_tile.rows >= 0;
  if (GATE_UP && !own) grid_dependency_wait();
  const int4 record = own ? make_int4(own_tile.expert, own_tile.first, own_tile.rows, 0)
                          : reinterpret_cast<const int4*>(tiles)[tile];  // one 16-byte load
  const int n_rows = record.z;
  if (n_rows == 0) {
    if (!GATE_UP || own) grid_dependency_wait();
    return;
  }
  const int expert = record.x, first = record.y;
  const int half_rows = GATE_UP ? R / 2 : R;
  const int row0 = blockIdx.x * (GATE_UP ? BM : A_ROWS);  // first condensed row (within the gate half for GATE_UP)
  const int slab_rows = GATE_UP ? half_rows : BM;          // row distance between the slabs (gate -> up, or stacked)

  extern __shared__ __align__(16) unsigned char smem_raw[];  // STAGES stages + 1 KB to align them
  StageT* stages = aligned_stages<StageT>(smem_raw);
  __shared__ __align__(16) SelT sel_tiles[STAGES];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  if (tid < BN && !own) {
    int pos = first + tid;
    token_row[tid] = tid < n_rows ? (GATE_UP ? sorted_slot[pos] / top_k : pos) : -1;
  }
  __syncthreads();

  const size_t expert_rows = (size_t)expert * R;
  const KRange k_range(K);  // split-K: this block's share of the k tiles
  const int kt_begin = k_range.begin, k_tiles = k_range.count;

  // Per-thread copy addresses, fixed for the whole k loop (a stage only adds its k offset). A: a row's 64 values
  // of a stage are A_CHUNKS 16-byte chunks (8 of T, 4 of FP8); chunk c = tid % A_CHUNKS of rows
  // tid / A_CHUNKS + j * A_STEP, so the XOR swizzle of T tiles (row & 7) is the same for every j. FP8 rows stay
  // unswizzled: each thread reads one whole chunk of rows g and g + 8 (fp8_fragment), 8 threads 128 contiguous bytes.
  // With FP8 activations a thread reads half-chunks 2 (t & 1), 2 (t & 1) + 1 of its rows: those are placed as in the ws
  // kernel (fp8_chunk_at: bits 1-2 of the row, the same for rows a_row + j A_STEP), else rows g = 0, 2, 4, 6 would
  // share banks four ways.
  constexpr int A_CHUNKS = FP8 ? 4 : 8;
  constexpr int A_STEP = THREADS / A_CHUNKS;  // rows between a thread's A chunks
  constexpr int A_COPIES = BM / A_STEP;       // A chunks per thread and slab
  const int a_row = tid / A_CHUNKS, a_chunk = tid % A_CHUNKS;
  const int a_dst = a_row * A_CHUNKS + (ACT8 ? fp8_chunk_at(a_row, a_chunk) : FP8 ? a_chunk : a_chunk ^ (a_row & 7));
  // meta: one 16-byte chunk (the 128 inputs of a stage) per row; thread r < A_ROWS copies row r.
  const int m_slab = tid / BM, m_row = tid % BM;
  // Values and meta are tiled (tiled_offset). Slabs start on tile boundaries, and a thread's rows a_row + j A_STEP
  // lie j A_STEP / TILE_ROWS tiles and (j A_STEP) % TILE_ROWS rows from its first (a_row < A_STEP, which divides
  // TILE_ROWS or is a multiple of it), so a copy adds compile-time multiples of one tile's size to one address.
  static_assert(TILE_ROWS % A_STEP == 0 || A_STEP % TILE_ROWS == 0, "a thread's rows keep their place in tiles");
  const size_t tile_values = (size_t)(K / BK) * (TILE_ROWS * 64);  // one tile of values, all its stages
  const size_t a_slab = tiled_offset<64>(slab_rows, 0, K);
  const auto* a_src =
      values + tiled_offset<64>(expert_rows + row0 + a_row, kt_begin, K) + a_chunk * (64 / A_CHUNKS);
  const int16_t* m_src =
      meta + tiled_offset<8>(expert_rows + row0 + (size_t)m_slab * slab_rows + m_row, kt_begin, K);
  // B: chunk tid % B_CHUNKS of token columns tid / B_CHUNKS + j * B_STEP, gathered through the routing index; a
  // token's BK inputs are 16 chunks of T, or 8 of e4m3 bytes (ACT8).
  constexpr int B_CHUNKS = ACT8 ? 8 : 16, B_COLS = BK / B_CHUNKS;  // B_COLS: inputs per chunk
  constexpr int B_STEP = THREADS / B_CHUNKS;
  constexpr int B_ITERS = (BN + B_STEP - 1) / B_STEP;
  const int b_col = tid / B_CHUNKS, b_chunk = tid % B_CHUNKS;
  // rowsel (samoyeds): thread tid < SelT::CHUNKS copies 16 rows of one segment per stage (its address made at
  // each stage: held for the whole loop it made ptxas spill in the decode tiles).
  const int n_seg = K / V;

  auto load_weights = [&](int slot, int kt) {  // the stage's A tile, metadata and row selections
    StageT& s = stages[slot];
#pragma unroll
    for (int h = 0; h < MT; ++h)
#pragma unroll
      for (int j = 0; j < A_COPIES; ++j) {
        const size_t at =
            (j * A_STEP / TILE_ROWS) * tile_values + (j * A_STEP % TILE_ROWS) * 64 + kt * (TILE_ROWS * 64);
        cp_async16(&s.a.chunk[a_dst + (h * BM + j * A_STEP) * A_CHUNKS], a_src + h * a_slab + at, 16);
      }
    if (tid < A_ROWS) cp_async16(&s.meta.half[tid * 8], m_src + (size_t)kt * TILE_ROWS * 8, 16);
    if (SAMOYEDS && tid < SelT::CHUNKS) {
      int sel_dst;
      const uint8_t* sel_src =
          SelT::template source<BM>(rowsel + (size_t)expert * n_seg * R, R, (kt_begin + kt) * SEGS, tid,
                                    [&](int h) { return row0 + h * slab_rows; }, sel_dst);
      cp_async16(&sel_tiles[slot].byte[sel_dst], sel_src, 16);
    }
  };
  auto load_tokens = [&](int slot, int kt) {  // the stage's B tile
    StageT& s = stages[slot];
#pragma unroll
    for (int j = 0; j < B_ITERS; ++j) {
      const int n = b_col + j * B_STEP;
      if (B_ITERS * B_STEP > BN && n >= BN) break;
      const int src_row = token_row[n];
      const auto* src = x + (size_t)(src_row < 0 ? 0 : src_row) * K + (size_t)(kt_begin + kt) * BK + b_chunk * B_COLS;
      cp_async16(&s.b.chunk[BTileT::at(n, b_chunk)], src, src_row < 0 ? 0 : 16);
    }
  };

  // Accumulators: [m tile][n8 tile][4]. For samoyeds, one per row of the pair (see the fold below).
  float acc[MT][NT][4] = {};
  float acc_odd[MT][NT][4] = {};   // unused (optimised away) for 2:4

  // The first STAGES - 1 stages. GEMM 2 commits their weights as groups of their own before the wait and their
  // tokens after it: the loop's cp_async_wait<STAGES - 2> then still finds stage kt complete (weights of every
  // prologue stage first, tokens in stage order).
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) {
      load_weights(s, s);
      if (GATE_UP) load_tokens(s, s);
    }
    cp_async_commit();
  }
  if constexpr (!GATE_UP) {
    grid_dependency_wait();
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) load_tokens(s, s);
      cp_async_commit();
    }
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
    if constexpr (WGMMA || ACT8) fence_proxy_async();
    __syncthreads();
    SelWord sel[MT][2];
    if constexpr (SAMOYEDS) stage_sel<MT, SEGS, A_ROWS>(sel, sel_tiles[kt % STAGES].byte, sel_rows);
    if (kt + STAGES - 1 < k_tiles) {
      load_weights((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
      load_tokens((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    }
    cp_async_commit();
    const StageT& s = stages[kt % STAGES];
    if constexpr (ACT8) {
      // e4m3 x e4m3, two 64-input k-steps, each read from the stage where it is used: k-step ks's halves of chunks
      // 2 (t & 1) and 2 (t & 1) + 1 of rows g and g + 8 of each m tile (e4m3_fragment_of_step), and lane t's
      // metadata word (row g + 8 (t & 1), groups 8 (t >> 1) .. of the k-step: halfwords 4 ks + 2 (t >> 1) and the
      // next). Each warpgroup issues its 64 rows of every m tile; the tensor cores read the tokens from the stage.
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        unsigned a[MT][4], e[MT];
#pragma unroll
        for (int h = 0; h < MT; ++h) {
          const int mr = h * BM + wrow0 + g;
          uint2 step[2][2];
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int c = 0; c < 2; ++c)
              step[r][c] = reinterpret_cast<const uint2*>(
                  &s.a.chunk[(mr + 8 * r) * A_CHUNKS + fp8_chunk_at(mr, 2 * (t & 1) + c)])[ks];
          e4m3_fragment_of_step(a[h], step, t);
          e[h] = *reinterpret_cast<const unsigned*>(&s.meta.half[(mr + 8 * (t & 1)) * 8 + 4 * ks + 2 * (t >> 1)]);
        }
        wgmma_step_begin<SAMOYEDS, SEG_STEPS>(acc, acc_odd, sel, kept_odd, ks);
        // k-step ks: the 64 one-byte inputs of each token row from chunk 4 ks (row 0 is unswizzled)
        const unsigned long long desc = sw128_desc(&s.b.chunk[BTileT::at(0, ks * 4)]);
#pragma unroll
        for (int h = 0; h < MT; ++h) wgmma_sp_e4m3<BN>(acc[h], a[h], desc, e[h]);
      }
      wgmma_drain(acc);  // before the stage's shared memory is refilled or acc is read
      continue;
    }
    uint4 a8[MT][2];  // FP8: rows g and g + 8 of each m tile, the 16 bytes of this thread for all 4 k-steps
    if constexpr (FP8) {
#pragma unroll
      for (int h = 0; h < MT; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) a8[h][r] = s.a.chunk[(h * BM + wrow0 + g + 8 * r) * A_CHUNKS + t];
    }

#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      if (SAMOYEDS && ks % SEG_STEPS == 0) {  // a segment starts: bring the kept rows' accumulators in place
        if (WGMMA && ks > 0) wgmma_drain(acc);  // V < 128: the segment before, in this stage, must finish first
        fold_segment(acc, acc_odd, sel, kept_odd, ks / SEG_STEPS);
      }
      unsigned a[MT][4], e[MT];
#pragma unroll
      for (int h = 0; h < MT; ++h) {
        if constexpr (FP8) {
          fp8_fragment<T>(a[h], a8[h], ks);
        } else {
          const int r = h * BM + wrow0 + (lane & 7) + ((lane >> 3) & 1) * 8;
          const int c = ks * 2 + (lane >> 4);
          ldmatrix_x4(a[h], &s.a.chunk[r * 8 + (c ^ (r & 7))]);
        }
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
        const unsigned long long desc = sw128_desc(&s.b.chunk[BTileT::at(0, ks * 4)]);
#pragma unroll
        for (int h = 0; h < MT; ++h) wgmma_sp_rs<T, BN>(acc[h], a[h], desc, e[h]);
      } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          unsigned b[4];
          const int n = j * 8 + (lane & 7);
          const int c = ks * 4 + (lane >> 3);
          ldmatrix_x4(b, &s.b.chunk[BTileT::at(n, c)]);
#pragma unroll
          for (int h = 0; h < MT; ++h) mma_sp<T>(acc[h][j], a[h], b, e[h]);
        }
      }
    }
    if constexpr (WGMMA) wgmma_drain(acc);  // before the stage's shared memory is refilled or d is read
  }
  cp_async_wait<0>();
  if (own) grid_dependency_wait();  // the next kernel may read the routing index before its own wait (ptx.cuh)
  allow_dependents();  // the next kernel's launch and first loads overlap this epilogue (ptx.cuh)
  if constexpr (SAMOYEDS) unfold(acc, acc_odd, kept_odd);
  int crow[MT];
#pragma unroll
  for (int h = 0; h < MT; ++h) crow[h] = row0 + (GATE_UP ? 0 : h * BM) + wrow0;
  if constexpr (FP8)
    scale_rows<SAMOYEDS, GATE_UP>(acc, acc_odd, crow, lane, scale + (size_t)expert * (GATE_UP ? 2 : 1) * N_out, N_out);
  if constexpr (ACT8 && GATE_UP)  // each token column's scale; GEMM 2 applies its columns' with their routing weights
    scale_columns<SAMOYEDS>(acc, acc_odd, lane, [&](int n) { return token_row[n] < 0 ? 0.0f : x_scale[token_row[n]]; });
  store_tile<T, SAMOYEDS, GATE_UP>(
      acc, acc_odd, crow, lane,
      [&](int n) { return n >= n_rows ? -1 : GATE_UP ? first + n : sorted_slot[first + n]; },
      [&](int n) { return n < n_rows ? sorted_weight[first + n] * (ACT8 ? x_scale[first + n] : 1.0f) : 1.0f; }, out,
      partial, N_out, slots);
}


// The kernel: this GEMM's operands from the layer's parameters, as restrict-qualified arguments of the body (the
// compiler then knows they do not alias: same code as separate kernel arguments; read through a struct, the
// pointers lost that and the kernels took more registers and spilled).
template <typename T, bool FP8, bool SAMOYEDS, int V, int BN, bool GATE_UP, int WARPS, int MT, bool WGMMA, bool ACT8>
__global__ void __launch_bounds__(WARPS * 32) moe_gemm(const __grid_constant__ MoEParams p) {
  const GemmOperands<T, GATE_UP> op{p};
  moe_gemm_body<T, FP8, SAMOYEDS, V, BN, GATE_UP, WARPS, MT, WGMMA, ACT8>(
      op.template b_rows<ACT8>(), ACT8 ? op.b_scale() : nullptr, op.template values<typename ValueOf<T, FP8>::type>(),
      op.meta(), op.rowsel(), op.scale(), op.out(),
      op.partial(), p.tiles, p.sorted_slot, p.sorted_weight,
      GATE_UP && maps_itself(p) ? p.topk_ids : nullptr, p.num_experts, op.R(), op.K(), p.top_k,
      op.N_out(), p.slots);
}

}  // namespace samoyeds
