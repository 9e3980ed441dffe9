// The routing index of a few tokens, which GEMM 1 works out from topk_ids itself instead of waiting for it.
//
// With at most FEW_TOKENS tokens (the narrowest token tile) and FEW_TOKEN_SLOTS slots, and no token routed twice to
// one expert (no top-k does that), an expert has at most FEW_TOKENS slots: one tile each, tiles in expert order
// (routing.cuh, write_tiles). The index places an expert's slots in slot order there (place_in_slot_order, instead
// of the atomics' order), so the whole map follows from topk_ids: tile t is the t-th smallest expert routed to this
// rank, its first sorted position is the number of slots on smaller experts, its columns the expert's tokens in
// slot order. GEMM 1 of the narrowest tile (gemm_mma.cuh) computes its own tile so (few_token_tile) and streams its
// weights and tokens while the index is built; the index lets it start right after its own wait, and GEMM 1 waits
// for the index only before it lets the next kernel start (GEMM 2 reads the index before its own wait). The plan
// decides (MoEParams::few_token_map; kernels/plan.py, maps_itself): a few tokens, that tile, no FP8 copy of x made
// between the index and GEMM 1 (which reads x before its wait). Both kernels' sides are in this file.
#pragma once

#include "config.cuh"
#include "params.cuh"

namespace samoyeds {

// Whether this forward's GEMM 1 maps itself: the plan's choice, with the bounds this file's arrays and the one-tile
// argument assume checked again (a plan past them takes the index's way on both sides).
__device__ __forceinline__ bool maps_itself(const MoEParams& p) {
  return p.few_token_map && p.chunks == 0 && p.tokens <= FEW_TOKENS && p.slots <= FEW_TOKEN_SLOTS;
}

// One lane per slot (FEW_TOKEN_SLOTS <= 32), so both sides work in one warp with no shared memory of their own: lanes
// with the same expert find each other in one __match_any_sync, and a slot's place among them is the count of lower
// lanes in that set. More slots would need shared memory and block barriers, and at 64 slots (Qwen3-30B-A3B at 8
// tokens) those cost GEMM 1 more than waiting for the index does (H200, docs/benchmarks.md).
static_assert(FEW_TOKEN_SLOTS <= 32, "one lane per slot");

// Lane `lane`'s expert among `slots` (-1 past them or for another rank's expert), the lanes sharing it, and how many of
// those come before it: its column in the expert's tile and its place among the expert's sorted positions.
struct SlotInWarp {
  int id;
  unsigned same;  // lanes routed to the same expert (lanes without one share id -1)
  int before;
};

__device__ __forceinline__ SlotInWarp slot_in_warp(const long long* topk_ids, int slots, int num_experts, int lane) {
  const long long raw = lane < slots ? __ldcg(topk_ids + lane) : -1;  // from L2: an earlier kernel wrote it
  const int id = raw >= 0 && raw < num_experts ? (int)raw : -1;
  const unsigned same = __match_any_sync(0xffffffffu, id);
  return {id, same, __popc(same & ((1u << lane) - 1))};
}

// The index's side (the first warp of its block; the other threads return at once): slot s goes to its expert's
// first position plus the number of earlier slots on that expert, with its routing weight.
__device__ __forceinline__ void place_in_slot_order(const MoEParams& p, const int* first) {
  if (threadIdx.x >= 32) return;
  const SlotInWarp slot = slot_in_warp(p.topk_ids, p.slots, p.num_experts, threadIdx.x);
  if (slot.id < 0) return;  // past the slots, or another rank's expert
  const int position = first[slot.id] + slot.before;
  p.sorted_slot[position] = threadIdx.x;
  p.sorted_weight[position] = p.topk_weights[threadIdx.x];
}

struct FewTokenTile {
  int rows;    // slots in the tile (0: past the last tile); -1: a token repeats an expert, use the index's map
  int expert;
  int first;   // sorted position of the tile's first slot
};

// GEMM 1's side: this block's tile from topk_ids (written before the index, so readable before the wait: ptx.cuh),
// and token_row[0, BN): the token of each column, -1 for padding. Every thread of the block calls it; the first warp
// works it out, one block barrier hands it to the rest (token_row included).
template <int BN>
__device__ __forceinline__ FewTokenTile few_token_tile(const long long* __restrict__ topk_ids, int slots, int top_k,
                                                       int num_experts, int tile, int* token_row) {
  static_assert(FEW_TOKENS <= BN, "an expert's slots of a few tokens fit one tile");
  __shared__ FewTokenTile mine;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const SlotInWarp slot = slot_in_warp(topk_ids, slots, num_experts, lane);
    const bool leads = slot.id >= 0 && slot.before == 0;  // the expert's first slot speaks for it
    const unsigned leaders = __ballot_sync(0xffffffffu, leads);
    int rank = 0, smaller = 0;  // experts and slots on experts with smaller ids: the tile and its first position
    for (int o = 0; o < slots; ++o) {
      const int other = __shfl_sync(0xffffffffu, slot.id, o);
      const bool below = other >= 0 && other < slot.id;
      smaller += below;
      rank += below && (leaders >> o & 1u);
    }
    // Two slots of one token on one expert (no top-k makes them) would need two columns of one token's row in
    // one tile, which the index's map handles: the whole block takes it.
    const int token_first = lane / top_k * top_k;
    const unsigned token_lanes = (top_k >= 32 ? 0xffffffffu : (1u << top_k) - 1) << token_first;
    const bool repeated = __any_sync(0xffffffffu, slot.id >= 0 && __popc(slot.same & token_lanes) > 1);
    const unsigned chosen = __ballot_sync(0xffffffffu, leads && rank == tile);
    const int leader = chosen ? __ffs(chosen) - 1 : 0;
    const int expert = __shfl_sync(0xffffffffu, slot.id, leader);
    const int first = __shfl_sync(0xffffffffu, smaller, leader);
    const int rows = chosen ? __popc(__shfl_sync(0xffffffffu, slot.same, leader)) : 0;
    for (int c = lane; c < BN; c += 32) token_row[c] = -1;
    __syncwarp();
    if (!repeated && rows > 0 && slot.id == expert) token_row[slot.before] = lane / top_k;
    if (lane == 0) mine = repeated ? FewTokenTile{-1, 0, 0} : FewTokenTile{rows, expert, first};
  }
  __syncthreads();
  return mine;
}

}  // namespace samoyeds
