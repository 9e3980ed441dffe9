// The samoyeds fold: how one MMA accumulator set serves both rows of a pair.
//
// A condensed row r of a samoyeds weight holds, segment by segment (V inputs each), the kept row of output pair r:
// row 2r in some segments, row 2r + 1 in others (rowsel says which). The MMA multiplies the condensed row into one
// accumulator per pair, which therefore sums the partial products of both rows; a second set, `odd`, tracks the
// odd row's share, updated by one FFMA per accumulator at each segment boundary, and `unfold` separates the two
// after the last segment. Two accumulator sets, so token tiles as wide as for 2:4.
#pragma once

#include "ptx.cuh"

namespace samoyeds {

// acc, the MMA target, sums the partial products of both rows of a pair; odd
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
// Before the wgmma.sp of k-step ks: where a segment starts (samoyeds), the MMAs of the segment before must finish
// (V < 128: it ran in this stage) before acc folds; then acc is pinned and fenced for the asynchronous MMAs.
template <bool SAMOYEDS, int SEG_STEPS, int MT, int NT, typename SelWord>
__device__ __forceinline__ void wgmma_step_begin(float (&acc)[MT][NT][4], float (&odd)[MT][NT][4],
                                                 const SelWord (&sel)[MT][2], bool (&kept_odd)[MT][2], int ks) {
  if (SAMOYEDS && ks % SEG_STEPS == 0) {
    if (ks > 0) wgmma_drain(acc);
    fold_segment(acc, odd, sel, kept_odd, ks / SEG_STEPS);
  }
#pragma unroll
  for (int h = 0; h < MT; ++h) wgmma_pin(acc[h]);
  wgmma_fence();
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

}  // namespace samoyeds
