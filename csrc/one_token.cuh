// The layer of one token (decode at batch 1): two kernels, and neither a routing index, split-K partials nor a slot
// sum.
//
// At one token each GEMM is a few hundred blocks streaming a few k tiles of one expert each, and the layer's time is
// its chain of dependent round trips to memory (docs/benchmarks.md). The general path (gemm_mma.cuh) splits GEMM 1
// along K over the grid into fp32 partials that a SiLU kernel adds, and writes GEMM 2's rows per slot for a
// slot-sum kernel to add: two reductions through global memory, each a launch and a round trip. Here the warps of
// one block split each reduction instead and add their parts in shared memory:
//   GEMM 1 (GATE_UP): block (slab of SLAB_ROWS condensed rows of gate and the same of up, slot j); its warps take
//     equal shares of the k tiles of slot j's expert; the block writes SiLU(gate) * up to act[j].
//   GEMM 2: block (slab of SLAB_ROWS condensed output rows); warp w takes slot w / Q and share w % Q of its k tiles
//     (Q = WARPS / top_k; the plan keeps top_k <= WARPS), weighted by the slot's routing weight; the block's sum is
//     the token's output: no per-slot rows, no slot sum.
// The experts come from topk_ids directly (a slot is its own tile), or from the router's logits (routed_slot). Each
// warp runs its own cp.async ring over its k tiles, with no block barrier in the k loop. The token is column 0 of
// the mma.sp B operand: lanes 0-3 (g = 0) hold it, built from the stage's inputs in shared memory, and the other
// lanes zeros; so the MMAs of a stage are those of one 8-token tile, and the tensor cores' work is nothing next to
// the weights' bytes.
#pragma once

#include "config.cuh"
#include "epilogue.cuh"
#include "fold.cuh"
#include "operands.cuh"
#include "params.cuh"
#include "ptx.cuh"
#include "tiles.cuh"

namespace samoyeds {

// One stage of a warp's ring: MT m16 tiles of weight rows (64 values each: T, or FP8 bytes in fp8_fragment's order),
// their metadata, the token's BK inputs, and the rows' selections of the stage's segments (samoyeds; room for the
// most, BK / 32, whatever the pattern, so the host mirrors one size: kernels/geometry.py, one_token_stage_bytes; at
// most 96 bytes unused for samoyeds, all of them for 2:4).
template <int MT, int VALUE_BYTES>
struct OneTokenStage {
  ATile<MT * SLAB_ROWS * VALUE_BYTES / 2> a;
  MetaTile<MT * SLAB_ROWS> meta;
  uint4 b[BK * 2 / 16];                      // the token's BK inputs, of T
  uint8_t sel[BK / 32 * MT * SLAB_ROWS];     // SelTile's layout: byte j * MT * SLAB_ROWS + r is segment j of row r
};

// A bf16 / fp16 value's bits as a key that orders as the values do (sign-magnitude: negatives flipped).
template <typename T>
__device__ __forceinline__ unsigned order_key(T v) {
  unsigned bits = *reinterpret_cast<const unsigned short*>(&v);
  if (bits == 0x8000u) bits = 0u;  // -0 is +0: the same probability, so vLLM ties them to the lower expert id
  return bits & 0x8000u ? ~bits & 0xFFFFu : bits | 0x8000u;
}
template <typename T>
__device__ __forceinline__ float key_value(unsigned key) {  // order_key's inverse, as a float
  const unsigned short bits = (unsigned short)(key & 0x8000u ? key & 0x7FFFu : ~key & 0xFFFFu);
  return (float)*reinterpret_cast<const T*>(&bits);
}

// Slot `slot` of the token: its expert (-1: no such slot, or an expert of another rank) and, WITH_WEIGHT, its routing
// weight. From topk_ids / topk_weights, or with router_logits as vLLM's topk_softmax makes them: softmax in fp32
// over the experts, the top_k largest (ties to the lower expert id), their probabilities, divided by their sum on
// request. Each lane holds up to MAX_ROUTED_LOGITS / 32 logits as keys (the logit's order_key above, 0xFFFF -
// expert below), so one __reduce_max_sync finds each winner in order, the lower id first among equal logits. A
// larger logit is a larger probability except where fp32 makes two equal (exp underflowing ~90 below the largest,
// or logits closer than fp32 resolves after the shift), which vLLM ties to the lower id and this
// orders by logit: the experts' weights there are equal or zero. The top-k costs top_k warp reductions instead of
// a kernel of its own. GEMM 1 needs no weight (its output is the expert's, unweighted) and it waits for the routing
// before its first weight load, so it stops at its own slot and skips the softmax; GEMM 2 routes before its wait,
// while GEMM 1 runs. Warp-collective: every lane gets the slot's answer.
template <typename T, bool WITH_WEIGHT>
__device__ __forceinline__ void routed_slot(const MoEParams& p, int slot, int& expert, float& weight) {
  weight = 1.0f;
  if (p.router_logits == nullptr) {
    const long long raw = slot < p.top_k ? __ldcg(p.topk_ids + slot) : -1;
    expert = raw >= 0 && raw < p.num_experts ? (int)raw : -1;
    if (WITH_WEIGHT) weight = expert < 0 ? 0.0f : __ldcg(p.topk_weights + slot);
    return;
  }
  constexpr int PER_LANE = MAX_ROUTED_LOGITS / 32;
  const T* logits = static_cast<const T*>(p.router_logits);  // one token: [num_experts]
  const int lane = threadIdx.x & 31;
  unsigned key[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = lane + 32 * i;
    key[i] = e < p.num_experts ? order_key(__ldcg(logits + e)) << 16 | (0xFFFFu - e) : 0u;
  }
  auto best_of_lane = [&](unsigned taken) {
    unsigned best = 0;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) best = !(taken >> i & 1u) && key[i] > best ? key[i] : best;
    return best;
  };
  expert = -1;
  unsigned taken = 0;     // bit i: key[i] already chosen
  float largest = 0.0f;   // the largest logit (the first winner): the softmax's shift
  float chosen = 0.0f;    // the top-k's exp(logit - largest), summed
  float own = 0.0f;       // the slot's
  const int rounds = WITH_WEIGHT ? p.top_k : min(slot + 1, p.top_k);
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
    const unsigned winner = __reduce_max_sync(0xffffffffu, best_of_lane(taken));
    const int e = 0xFFFF - (int)(winner & 0xFFFFu);
    if (e % 32 == lane) taken |= 1u << (e / 32);
    if (r == slot) expert = e;
    if (WITH_WEIGHT) {
      if (r == 0) largest = key_value<T>(winner >> 16);
      const float x = expf(key_value<T>(winner >> 16) - largest);
      chosen += x;
      if (r == slot) own = x;
    }
  }
  if (!WITH_WEIGHT) return;
  if (p.renormalize) {
    weight = own / chosen;  // the softmax's denominator cancels
    return;
  }
  float exps = 0.0f;  // the softmax's denominator
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i)
    if (key[i] != 0u) exps += expf(key_value<T>(key[i] >> 16) - largest);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) exps += __shfl_xor_sync(0xffffffffu, exps, offset);
  weight = own / exps;  // 0 for a slot past top_k
}

template <typename T, bool FP8, bool SAMOYEDS, int V, bool GATE_UP, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 1) moe_one_token(const __grid_constant__ MoEParams p) {
  static_assert(BK % V == 0 && V % 32 == 0, "a segment is whole k-steps of one stage");
  constexpr int MT = GATE_UP ? 2 : 1;      // gate and up tiles of the same rows, or the output rows
  constexpr int ROWS = MT * SLAB_ROWS;     // weight rows of a warp's stage
  constexpr int SEGS = BK / V;
  constexpr int SEG_STEPS = V / 32;
  constexpr int A_CHUNKS = FP8 ? 4 : 8;    // 16-byte chunks of a row's 64 values per stage
  using Value = typename ValueOf<T, FP8>::type;
  using SelWord = typename SelWordOf<SEGS>::type;
  using StageT = OneTokenStage<MT, FP8 ? 1 : 2>;
  const GemmOperands<T, GATE_UP> op{p};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int K = op.K(), R = op.R(), N_out = op.N_out();
  const int half_rows = GATE_UP ? R / 2 : R;  // gate rows, then up rows
  const int row0 = blockIdx.x * SLAB_ROWS;    // first condensed row of the slab (in each half for GATE_UP)

  // This warp's share: slot, and its k tiles [kt0, kt0 + k_count).
  const int k_tiles = K / BK;
  const int shares = GATE_UP ? WARPS : max(1, WARPS / p.top_k);
  const int slot = GATE_UP ? blockIdx.y : warp / shares;
  const int share = GATE_UP ? warp : warp % shares;
  const int kt0 = k_tiles * share / shares;
  int k_count = k_tiles * (share + 1) / shares - kt0;
  // GEMM 1 is the forward's first kernel: the routing (or the router's logits) comes from the kernel before it.
  // GEMM 2 reads it before its wait (written two launches back: ptx.cuh) and streams its first stages of weights
  // meanwhile.
  if constexpr (GATE_UP) grid_dependency_wait();
  int expert;
  float weight;
  routed_slot<T, !GATE_UP>(p, slot, expert, weight);
  if (GATE_UP && expert < 0) return;  // the whole block's slot: act[slot] is not read (GEMM 2 skips the slot too)
  if (expert < 0) k_count = 0;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  StageT* ring = reinterpret_cast<StageT*>(smem_raw) + warp * ONE_TOKEN_STAGES;
  const size_t first_row = (size_t)(expert < 0 ? 0 : expert) * R + row0;  // row 0 of tile 0 among all experts
  const Value* values = op.template values<Value>();
  const int n_seg = K / V;
  const T* token = GATE_UP ? op.x() : op.x() + (size_t)slot * K;  // x [1, H], or act [slots, I] by slot

  auto load_weights = [&](int slot_in_ring, int kt) {  // values, metadata and row selections of k tile kt0 + kt
    StageT& s = ring[slot_in_ring];
    const int k = kt0 + kt;
#pragma unroll
    for (int i = 0; i < ROWS * A_CHUNKS / 32; ++i) {
      const int c = lane + 32 * i, r = c / A_CHUNKS, chunk = c % A_CHUNKS;
      const size_t row = first_row + (r / SLAB_ROWS) * half_rows + r % SLAB_ROWS;
      // FP8 rows unswizzled (fp8_fragment reads a whole chunk), T rows in the ldmatrix swizzle (tiles.cuh)
      const int dst = r * A_CHUNKS + (FP8 ? chunk : chunk ^ (r & 7));
      cp_async16(&s.a.chunk[dst], values + tiled_offset<64>(row, k, K) + chunk * (64 / A_CHUNKS), 16);
    }
    if (lane < ROWS) {
      const size_t row = first_row + (lane / SLAB_ROWS) * half_rows + lane % SLAB_ROWS;
      cp_async16(&s.meta.half[lane * 8], op.meta() + tiled_offset<8>(row, k, K), 16);
    }
    if (SAMOYEDS && lane < SEGS * MT) {  // 16 rows of one segment are 16 contiguous bytes (segment-major rowsel)
      const int j = lane / MT, h = lane % MT;
      const uint8_t* src = op.rowsel() + ((size_t)(expert < 0 ? 0 : expert) * n_seg + k * SEGS + j) * R + row0 +
                           h * half_rows;
      cp_async16(&s.sel[j * ROWS + h * SLAB_ROWS], src, 16);
    }
  };
  auto load_token = [&](int slot_in_ring, int kt) {  // the token's inputs of k tile kt0 + kt
    if (lane < BK * 2 / 16) cp_async16(&ring[slot_in_ring].b[lane], token + (size_t)(kt0 + kt) * BK + lane * 8, 16);
  };

  // The first ONE_TOKEN_STAGES - 1 stages; GEMM 2 commits their weights as groups of their own before its wait and
  // the token's inputs after it (as gemm_mma.cuh: the loop's wait still finds stage kt complete).
  for (int s = 0; s < ONE_TOKEN_STAGES - 1; ++s) {
    if (s < k_count) {
      load_weights(s, s);
      if (GATE_UP) load_token(s, s);
    }
    cp_async_commit();
  }
  if constexpr (!GATE_UP) {
    grid_dependency_wait();
    for (int s = 0; s < ONE_TOKEN_STAGES - 1; ++s) {
      if (s < k_count) load_token(s, s);
      cp_async_commit();
    }
  }

  float acc[MT][1][4] = {};
  float acc_odd[MT][1][4] = {};  // the samoyeds fold's odd rows (fold.cuh); optimised away for 2:4
  bool kept_odd[MT][2] = {};
  int sel_rows[MT];
#pragma unroll
  for (int h = 0; h < MT; ++h) sel_rows[h] = h * SLAB_ROWS + g;

  for (int kt = 0; kt < k_count; ++kt) {
    cp_async_wait<ONE_TOKEN_STAGES - 2>();
    __syncwarp();  // every lane's copies of stage kt landed, and every lane is done with the slot refilled next
    if (kt + ONE_TOKEN_STAGES - 1 < k_count) {
      load_weights((kt + ONE_TOKEN_STAGES - 1) % ONE_TOKEN_STAGES, kt + ONE_TOKEN_STAGES - 1);
      load_token((kt + ONE_TOKEN_STAGES - 1) % ONE_TOKEN_STAGES, kt + ONE_TOKEN_STAGES - 1);
    }
    cp_async_commit();
    const StageT& s = ring[kt % ONE_TOKEN_STAGES];
    SelWord sel[MT][2];
    if constexpr (SAMOYEDS) stage_sel<MT, SEGS, ROWS>(sel, s.sel, sel_rows);
    uint4 a8[MT][2];  // FP8: rows g and g + 8 of each tile, this thread's 16 bytes of all 4 k-steps
    if constexpr (FP8) {
#pragma unroll
      for (int h = 0; h < MT; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) a8[h][r] = s.a.chunk[(h * SLAB_ROWS + g + 8 * r) * A_CHUNKS + t];
    }
    const unsigned* inputs = reinterpret_cast<const unsigned*>(s.b);  // two inputs per word
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (SAMOYEDS && ks % SEG_STEPS == 0) fold_segment(acc, acc_odd, sel, kept_odd, ks / SEG_STEPS);
      // B of k-step ks (ldmatrix's layout in gemm_mma.cuh): register m of lane (g, t) holds inputs 32 ks + 8 m + 2t
      // and + 1 of token column g; only column 0 is the token.
      unsigned b[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) b[m] = g == 0 ? inputs[ks * 16 + 4 * m + t] : 0u;
#pragma unroll
      for (int h = 0; h < MT; ++h) {
        unsigned a[4];
        if constexpr (FP8) {
          fp8_fragment<T>(a, a8[h], ks);
        } else {
          const int r = h * SLAB_ROWS + (lane & 7) + ((lane >> 3) & 1) * 8;
          const int c = ks * 2 + (lane >> 4);
          ldmatrix_x4(a, &s.a.chunk[r * 8 + (c ^ (r & 7))]);
        }
        const int mr = h * SLAB_ROWS + g;
        const unsigned e = (unsigned)s.meta.half[mr * 8 + ks * 2 + (t & 1)] |
                           ((unsigned)s.meta.half[(mr + 8) * 8 + ks * 2 + (t & 1)] << 16);
        mma_sp<T>(acc[h][0], a, b, e);
      }
    }
  }
  cp_async_wait<0>();
  allow_dependents();  // the next kernel's launch and first loads overlap the reduction below (ptx.cuh)

  if (k_count > 0) {
    if constexpr (SAMOYEDS) unfold(acc, acc_odd, kept_odd);
    if constexpr (FP8) {
      int crow[MT];
#pragma unroll
      for (int h = 0; h < MT; ++h) crow[h] = row0;
      scale_rows<SAMOYEDS, GATE_UP>(acc, acc_odd, crow, lane, op.scale() + (size_t)expert * MT * N_out, N_out);
    }
  }
  // The warps' parts of the token's column (lanes with t = 0: rows g and g + 8 of each tile), added in warp order.
  __shared__ float part[WARPS][MT][2][SLAB_ROWS];  // [warp][tile][even, odd][row]
  if (t == 0) {
#pragma unroll
    for (int h = 0; h < MT; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        part[warp][h][0][g + 8 * r] = weight * acc[h][0][2 * r];
        part[warp][h][1][g + 8 * r] = SAMOYEDS ? weight * acc_odd[h][0][2 * r] : 0.0f;
      }
  }
  __syncthreads();
  if (threadIdx.x >= SLAB_ROWS) return;
  const int r = threadIdx.x;
  float sum[MT][2] = {};
#pragma unroll
  for (int w = 0; w < WARPS; ++w)
#pragma unroll
    for (int h = 0; h < MT; ++h)
#pragma unroll
      for (int o = 0; o < 2; ++o) sum[h][o] += part[w][h][o][r];
  // Output row of condensed row row0 + r: samoyeds' pair 2 (row0 + r), + 1 in one store, or 2:4's row0 + r.
  const int col = SAMOYEDS ? 2 * (row0 + r) : row0 + r;
  if constexpr (GATE_UP) {
    T* act = static_cast<T*>(p.act) + (size_t)slot * N_out;  // act [slots, I] by slot
    const float even = silu(sum[0][0]) * sum[1][0];
    if constexpr (SAMOYEDS) store_pair(act + col, even, silu(sum[0][1]) * sum[1][1]);
    else act[col] = from_float<T>(even);
  } else {
    T* out = static_cast<T*>(p.out);  // [1, H]
    if constexpr (SAMOYEDS) store_pair(out + col, sum[0][0], sum[0][1]);
    else out[col] = from_float<T>(sum[0][0]);
  }
}

}  // namespace samoyeds
