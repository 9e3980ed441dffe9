// The warp-specialised expert GEMM of wide token tiles on Hopper (sm_90a): wgmma.mma_async.sp fed by a copying
// warpgroup, persistent blocks walking (token tile, row block) work items.
//
// Warpgroup 0 copies (cp.async: the weight tiles, and the tokens gathered through the routing index), two MMA
// warpgroups multiply: each owns MT = 2 m64 tiles of condensed weight rows (the same 64 rows of gate and of up for
// GATE_UP, two stacked 64-row slabs for GEMM 2) and shares the block's B tile of BN tokens (64; 128 for 2:4, which
// keeps one accumulator set). Stages pass between them through mbarriers (full: the copies landed; empty: the
// wgmmas that read a stage are done), so the copies of later stages run while the tensor cores work, and the two
// MMA warpgroups overlap one's fold and drain with the other's wgmmas. A and B are both read by the tensor cores
// from the 128-byte-swizzled tiles of tiles.cuh through descriptors; only the metadata passes through registers.
// FP8 values: the copier moves half the weight bytes (its copies are what the MMA warpgroups wait on:
// docs/benchmarks.md), and each MMA warpgroup turns its rows into exact T fragments in registers (fp8_fragment)
// for wgmma.sp with A in registers and scales its output rows in the epilogue, as moe_gemm does; the MMAs stay
// T x T.
// FP8 activations (ACT8, with FP8 values): the copier gathers FP8 copies of the token rows (quantize.cuh; half
// the B bytes), and the MMA warpgroups issue e4m3 x e4m3 wgmma.sp (64-input k-steps at twice the T x T rate) with
// A fragments picked from the stored byte order (e4m3_fragment: no conversion); each token column's scale joins
// its routing weight in the epilogue.
// The blocks are persistent (one per SM), so the copier fills the next work item's stages while the MMA
// warpgroups run an epilogue. What both GEMM kernels share is written once: the tiles and the split-K range
// (tiles.cuh), the operands (operands.cuh), the samoyeds fold (fold.cuh) and the epilogue (epilogue.cuh). The stage
// copies are each kernel's own: here one 128-thread warpgroup on 64 registers copies for the whole block and runs
// ahead across work items, in moe_gemm every thread copies its share of the next stage and then multiplies.
#pragma once

#include "config.cuh"
#include "epilogue.cuh"
#include "fold.cuh"
#include "operands.cuh"
#include "params.cuh"
#include "ptx.cuh"
#include "tiles.cuh"

namespace samoyeds {

namespace ws {
constexpr int CONSUMERS = WS_CONSUMERS;  // MMA warpgroups per block
constexpr int THREADS = 128 * (CONSUMERS + 1);
// Pipeline depth by token-tile width and value bytes (config.cuh); each stage is handed over by the arrivals its
// copies trigger when they land, so every free stage is in flight.
template <int BN, bool FP8>
constexpr int STAGES =
    BN == 64 ? (FP8 ? WS_STAGES_BN64_FP8 : WS_STAGES_BN64) : (FP8 ? WS_STAGES_BN128_FP8 : WS_STAGES_BN128);
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
  int expert;        // FP8 values: whose output-row scales the epilogue applies
};

template <typename T, bool FP8, bool SAMOYEDS, int V, int BN, bool GATE_UP, bool ACT8>
__device__ __forceinline__ void moe_gemm_ws_body(
    const typename Pick<ACT8, uint8_t, T>::type* __restrict__ x,  // the B rows: T, or e4m3 bytes for ACT8
    const float* __restrict__ x_scale,                            // ACT8: each B row's scale (quantize.cuh)
    const typename ValueOf<T, FP8>::type* __restrict__ values,
    const int16_t* __restrict__ meta, const uint8_t* __restrict__ rowsel, const float* __restrict__ scale,
    T* __restrict__ out, float* __restrict__ partial,
    const int* __restrict__ tiles,
    const int* __restrict__ sorted_slot, const float* __restrict__ sorted_weight, int R, int K, int top_k, int N_out,
    int slots,            // the arguments of moe_gemm_body, then:
    int row_blocks,       // blocks of 128 condensed rows (per half for GATE_UP)
    int num_tiles) {      // token tiles in the tile map
  using ws::CONSUMERS;
  static_assert(BN == 64 || (BN == 128 && !SAMOYEDS), "samoyeds keeps two accumulator sets: 64 tokens fit");
  static_assert(!ACT8 || (FP8 && V % 64 == 0), "FP8 activations: FP8 values, segments of whole 64-input k-steps");
  constexpr int MT = 2, NT = BN / 8, SLAB = WS_SLAB;
  constexpr int SLABS = CONSUMERS * MT;
  constexpr int A_ROWS = SLABS * SLAB;
  constexpr int STAGES_WS = ws::STAGES<BN, FP8>;
  // k-steps per stage: 4 of 32 inputs (T x T), or 2 of 64 (FP8 x FP8)
  constexpr int KSTEPS = ACT8 ? 2 : 4, SEGS = BK / V, SEG_STEPS = V / (BK / KSTEPS);
  using StageT = Stage<BN, A_ROWS, FP8 ? 1 : 2, ACT8>;
  using BTileT = typename Pick<ACT8, BTile8<BN>, BTile<BN>>::type;
  using SelWord = typename SelWordOf<SEGS>::type;
  using SelT = SelTile<SAMOYEDS ? SEGS : 1, SAMOYEDS ? A_ROWS : 16>;
  static_assert(BK % V == 0 && SEG_STEPS >= 1, "a segment is whole k-steps of one stage");
  static_assert(SLAB == TILE_ROWS, "a slab's rows are one tile of the stored values and metadata");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  StageT* stages = aligned_stages<StageT>(smem_raw);
  __shared__ __align__(16) SelT sel_tiles[STAGES_WS];
  __shared__ ItemInfo<BN> item_info[2];
  __shared__ unsigned long long full[STAGES_WS], empty[STAGES_WS], item_full[2], item_empty[2];
  // The copier's: row of x for each token column of the item (-1: padding), column b_col + B_COLS j at
  // [b_col][j], so a copying thread reads the rows of its columns four at a time. With one dependent 4-byte load in
  // front of each B cp.async the copier's issue was what the MMA warpgroups waited for (H100 ncu, 2:4 at
  // T = 4096); this read made the layer 6-9% faster at T = 4096 / 16384. A token row of a stage is B_CHUNKS
  // 16-byte chunks (16 of T, 8 of FP8), so the 128 copying threads take B_COLS columns at a time.
  constexpr int B_CHUNKS = ACT8 ? 8 : 16, B_COLS = 128 / B_CHUNKS;
  __shared__ __align__(16) int token_rows[B_COLS][BN / B_COLS];

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
  grid_dependency_wait();  // (ptx.cuh) below, the copier reads the tile map and x or act

  const int half_rows = GATE_UP ? R / 2 : R;
  const KRange k_range(K);  // split-K: this block's share of the k tiles
  const int kt_begin = k_range.begin, k_tiles = k_range.count;
  // Slab q = consumer * MT + h of row block rb: its first condensed row in the expert (GATE_UP: h = 1 is up).
  auto slab_row = [&](int rb, int q) {
    const int row0 = rb * CONSUMERS * (GATE_UP ? SLAB : MT * SLAB);
    return GATE_UP ? row0 + (q / MT) * SLAB + (q % MT) * half_rows : row0 + q * SLAB;
  };

  if (warp < 4) {  // ---- the copier warpgroup
    regs_shrink<ws::COPY_REGS>();
    // A: a row's 64 values of a stage are A_CHUNKS 16-byte chunks (8 of T, 4 of FP8); chunk tid % A_CHUNKS of rows
    // tid / A_CHUNKS + A_STEP j of every slab, so the XOR swizzle of the tile is the same for all (fp8_chunk_at
    // for FP8 rows). meta: one 16-byte chunk per row and stage, rows tid + 128 i. B: chunk tid % B_CHUNKS of token
    // columns tid / B_CHUNKS + B_COLS j, gathered through the routing index. rowsel: one chunk per thread < CHUNKS.
    constexpr int A_CHUNKS = FP8 ? 4 : 8, A_STEP = 128 / A_CHUNKS;
    const int a_row = tid / A_CHUNKS, a_chunk = tid % A_CHUNKS, b_col = tid / B_CHUNKS, b_chunk = tid % B_CHUNKS;
    const int a_dst = a_row * A_CHUNKS + (FP8 ? fp8_chunk_at(a_row, a_chunk) : a_chunk ^ (a_row & 7));
    const int n_seg = K / V;
    int stage = 0;  // stages issued over all items
    int item = 0;   // items handed to the MMA warpgroups
    // Persistent blocks walk the work items (token tile, row block) in TILE_GROUP order. The copier skips the
    // empty tiles, hands each item to the MMA warpgroups through item_info, and counts stages over all items: it
    // runs ahead into the next item while the MMA warpgroups run an epilogue.
    const int tile_group = row_blocks >= ws::GROUPED_FROM_ROW_BLOCKS ? ws::TILE_GROUP : 1;
    const int items = row_blocks * num_tiles;
    auto item_at = [&](int w, int& rb) {  // work item w: its token tile, and its row block in rb
      const int group = w / (tile_group * row_blocks), in_group = w % (tile_group * row_blocks);
      const int group_tiles = min(tile_group, num_tiles - group * tile_group);
      rb = in_group / group_tiles;
      return group * tile_group + in_group % group_tiles;
    };
    // The set-up of an item is a chain of dependent loads (tile record -> sorted_slot and its weight -> x's scale
    // for ACT8) that the copier waits through before it can issue the item's copies; loaded at the item's start,
    // the record alone was 9.6% of GEMM 2's warp samples at T = 256 (ncu, H200, Qwen3-30B-A3B samoyeds FP8). So the
    // record is read an item ahead, to land while the copies of the item before are issued: each lane loads word
    // lane % 4 and the fields come by shuffles when the item starts. A record loaded whole into every lane alike
    // went to uniform registers, and the move there (R2UR) waited on the load right after it was issued.
    const int word = tid & 3;  // the record's word this lane holds: expert, first, n_rows, unused
    int rb_ahead;
    int record_ahead = blockIdx.x < items ? tiles[4 * item_at(blockIdx.x, rb_ahead) + word] : 0;
    for (int w = blockIdx.x; w < items; w += gridDim.x) {
      const int rb = rb_ahead, record = record_ahead;
      if (w + gridDim.x < items) record_ahead = tiles[4 * item_at(w + gridDim.x, rb_ahead) + word];
      const int expert = __shfl_sync(~0u, record, 0), first = __shfl_sync(~0u, record, 1),
                n_rows = __shfl_sync(~0u, record, 2);
      if (n_rows == 0) continue;
      const size_t expert_rows = (size_t)expert * R;
      // One base address each for A and meta (tiled: tiled_offset in tiles.cuh; a slab is one tile, SLAB =
      // TILE_ROWS); the slabs sit at fixed tile offsets from the first (few registers here: the copier runs on
      // COPY_REGS).
      const auto* a_src = values + tiled_offset<64>(expert_rows + slab_row(rb, 0), kt_begin, K) + a_row * 64 +
                          a_chunk * (64 / A_CHUNKS);
      const int16_t* m_src =
          meta + tiled_offset<8>(expert_rows + slab_row(rb, tid / SLAB), kt_begin, K) + (tid % SLAB) * 8;
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
      if (tid < BN) {  // column tid is entry tid / B_COLS of the rows of b_col = tid % B_COLS (see token_rows)
        int row = -1, slot = -1;
        float weight = 1.0f;  // ACT8: times the B row's scale, which the epilogue applies with it
        if (tid < n_rows) {
          const int pos = first + tid;
          if (GATE_UP) {
            row = sorted_slot[pos] / top_k;
            slot = pos;
          } else {
            row = pos;
            slot = sorted_slot[pos];
            weight = sorted_weight[pos];
          }
          if (ACT8) weight *= x_scale[row];
        }
        token_rows[tid % B_COLS][tid / B_COLS] = row;
        info.slot[tid] = slot;
        info.weight[tid] = weight;
      }
      if (tid == 0) info.row_block = rb, info.n_rows = n_rows, info.expert = expert;
      mbar_arrive(&item_full[item & 1]);
      ++item;
      copier_sync();
      const auto* b_src = x + (size_t)kt_begin * BK + b_chunk * (16 / sizeof(*x));
      for (int kt = 0; kt < k_tiles; ++kt, ++stage) {
        const int slot = stage % STAGES_WS;
        if (stage >= STAGES_WS) mbar_wait(&empty[slot], (stage / STAGES_WS - 1) & 1);
        StageT& s = stages[slot];
#pragma unroll
        for (int q = 0; q < SLABS; ++q)
#pragma unroll
          for (int j = 0; j < SLAB / A_STEP; ++j)
            cp_async16(&s.a.chunk[a_dst + (q * SLAB + A_STEP * j) * A_CHUNKS],
                       a_src + (size_t)(slab_offset(q) / SLAB) * (K / BK) * (SLAB * 64) + kt * (SLAB * 64) +
                           A_STEP * j * 64,
                       16);
#pragma unroll
        for (int i = 0; i < A_ROWS / 128; ++i)  // row tid + 128 i: slab tid / 64 + 2 i
          cp_async16(&s.meta.half[(tid + 128 * i) * 8],
                     m_src + (size_t)((slab_offset(tid / SLAB + 2 * i) - slab_offset(tid / SLAB)) / SLAB) * (K / BK) *
                                 (SLAB * 8) +
                         kt * (SLAB * 8),
                     16);
        if (SAMOYEDS && tid < SelT::CHUNKS)
          cp_async16(&sel_tiles[slot].byte[sel_dst], sel_src + (size_t)kt * SEGS * R, 16);
#pragma unroll
        for (int q = 0; q < BN / B_COLS / 4; ++q) {
          const int4 rows = *reinterpret_cast<const int4*>(&token_rows[b_col][4 * q]);
          const int row[4] = {rows.x, rows.y, rows.z, rows.w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
            cp_async16(&s.b.chunk[BTileT::at(b_col + B_COLS * (4 * q + i), b_chunk)],
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
        // Metadata of the warp's rows g and g + 8 for the stage's k-steps: one 16-byte row each (8 halfwords of 16
        // inputs). T x T: k-step ks takes halfword 2 ks + (t & 1) of both (lanes 4g, 4g + 1 carry inputs 0-15 and
        // 16-31 of the step); FP8 x FP8: lane t takes word 2 ks + (t >> 1) of row g + 8 (t & 1) (wgmma_sp_e4m3).
        unsigned e[MT][KSTEPS];
        // FP8 values: this thread's 16 bytes of rows g and g + 8 of each m tile (T x T), or chunks 2 (t & 1) and
        // 2 (t & 1) + 1 of both rows (FP8 x FP8: e4m3_fragment)
        [[maybe_unused]] uint4 a8[MT][2][ACT8 ? 2 : 1];
#pragma unroll
        for (int h = 0; h < MT; ++h) {
          const int mr = (consumer * MT + h) * SLAB + wrow0 + g;
          if constexpr (FP8) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int c = 0; c < (ACT8 ? 2 : 1); ++c)
                a8[h][r][c] = s.a.chunk[(mr + 8 * r) * 4 + fp8_chunk_at(mr, ACT8 ? 2 * (t & 1) + c : t)];
          }
          const uint4 lo = *reinterpret_cast<const uint4*>(&s.meta.half[mr * 8]);
          const uint4 hi = *reinterpret_cast<const uint4*>(&s.meta.half[(mr + 8) * 8]);
          if constexpr (ACT8) {
            const bool odd_row = t & 1, second = t >> 1;  // selects: no indexed registers (a stack frame)
            e[h][0] = second ? (odd_row ? hi.y : lo.y) : (odd_row ? hi.x : lo.x);
            e[h][1] = second ? (odd_row ? hi.w : lo.w) : (odd_row ? hi.z : lo.z);
          } else {
            const unsigned pick = (t & 1) ? 0x7632 : 0x5410;
            e[h][0] = __byte_perm(lo.x, hi.x, pick);
            e[h][1] = __byte_perm(lo.y, hi.y, pick);
            e[h][2] = __byte_perm(lo.z, hi.z, pick);
            e[h][3] = __byte_perm(lo.w, hi.w, pick);
          }
        }
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
          [[maybe_unused]] unsigned a[MT][4];  // FP8: this k-step's A fragments
          if constexpr (ACT8) {
#pragma unroll
            for (int h = 0; h < MT; ++h) e4m3_fragment(a[h], a8[h], t, ks);
          } else if constexpr (FP8) {
#pragma unroll
            for (int h = 0; h < MT; ++h) fp8_fragment<T>(a[h], {a8[h][0][0], a8[h][1][0]}, ks);
          }
          if (FP8 || ks % SEG_STEPS == 0)  // new A registers, or a segment starts (2:4: the stage)
            wgmma_step_begin<SAMOYEDS, SEG_STEPS>(acc, acc_odd, sel, kept_odd, ks);
          // k-step ks: 16 compressed values (32 B) into each A row, 32 inputs (64 B) into the B rows of panel
          // ks / 2 (FP8 x FP8: 64 inputs, 64 B, of the one panel); row 0 of each tile is unswizzled, so those are
          // the start addresses.
          const unsigned long long b_desc = sw128_desc(&s.b.chunk[BTileT::at(0, ks * 4)]);
#pragma unroll
          for (int h = 0; h < MT; ++h) {
            if constexpr (ACT8)
              wgmma_sp_e4m3<BN>(acc[h], a[h], b_desc, e[h][ks]);
            else if constexpr (FP8)
              wgmma_sp_rs<T, BN>(acc[h], a[h], b_desc, e[h][ks]);
            else
              wgmma_sp_ss<T, BN>(acc[h], sw128_desc(&s.a.chunk[(consumer * MT + h) * SLAB * 8 + ks * 2]),
                                 b_desc, e[h][ks]);
          }
        }
        wgmma_drain(acc);
        mbar_arrive(&empty[slot]);
      }
      if constexpr (SAMOYEDS) unfold(acc, acc_odd, kept_odd);
      int crow[MT];
#pragma unroll
      for (int h = 0; h < MT; ++h) crow[h] = slab_row(rb, consumer * MT + (GATE_UP ? 0 : h)) + wrow0;
      if constexpr (FP8)
        scale_rows<SAMOYEDS, GATE_UP>(acc, acc_odd, crow, lane,
                                      scale + (size_t)info.expert * (GATE_UP ? 2 : 1) * N_out, N_out);
      if constexpr (ACT8 && GATE_UP)  // GEMM 2 applies the columns' scales with their routing weights
        scale_columns<SAMOYEDS>(acc, acc_odd, lane, [&](int n) { return info.weight[n]; });
      store_tile<T, SAMOYEDS, GATE_UP>(
          acc, acc_odd, crow, lane, [&](int n) { return info.slot[n]; },
          [&](int n) { return info.weight[n]; }, out, partial, N_out, slots);
      mbar_arrive(&item_empty[item & 1]);
    }
  }
}


// The kernel: as moe_gemm, the operands as restrict-qualified arguments of the body; work items are (token tile,
// row block) pairs, row blocks of CONSUMERS x MT x 64 condensed rows (per half for GATE_UP). ACT8: the B rows are
// the FP8 copies quantize_rows made, multiplied by e4m3 wgmma.sp (FP8 values only).
template <typename T, bool FP8, bool SAMOYEDS, int V, int BN, bool GATE_UP, bool ACT8>
__global__ void __launch_bounds__(ws::THREADS, 1) moe_gemm_ws(const __grid_constant__ MoEParams p) {
  const GemmOperands<T, GATE_UP> op{p};
  const int row_blocks = (GATE_UP ? op.R() / 2 : op.R()) / (ws::CONSUMERS * (GATE_UP ? 1 : 2) * WS_SLAB);
  moe_gemm_ws_body<T, FP8, SAMOYEDS, V, BN, GATE_UP, ACT8>(
      op.template b_rows<ACT8>(), op.b_scale(), op.template values<typename ValueOf<T, FP8>::type>(), op.meta(),
      op.rowsel(), op.scale(), op.out(),
      op.partial(), p.tiles,
      p.sorted_slot, p.sorted_weight, op.R(), op.K(), p.top_k, op.N_out(), p.slots, row_blocks, p.num_tiles);
}

}  // namespace samoyeds
