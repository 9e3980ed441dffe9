// The parameters of one MoE forward: every kernel of this directory takes this struct (by value, in the kernel
// parameter space) and reads the fields it needs. samoyeds_vllm/kernels/params.py fills it: its MoEParams and
// PackedExperts mirror these structs field for field, and tests/unit/test_kernel_contract.py compiles this header
// and checks the names, order and offsets. Plain C++ (one member per line), so a host compiler can check it.
#pragma once

namespace samoyeds {

// One projection of every expert, packed (format version 1, samoyeds_vllm/format/packing.py).
struct PackedExperts {
  const void* values;            // [E, R, K/2] the kept values: the activations' dtype, or FP8 e4m3 bytes in the
                                 // order of fp8_fragment (tiles.cuh; kernels/weights.py makes it)
  const short* meta;             // [E, R, K/16] ordered sparse-MMA metadata, 4 nibbles per 16 inputs
  const unsigned char* rowsel;   // [E, R, K/V] samoyeds row selections stored segment-major; null for 2:4
  const float* scale;            // [E, output rows] FP8 values: each dense output row's scale; null otherwise
  int rows;                      // R: packed rows per expert (w13: the gate rows, then the up rows)
};

// Slot s = token * top_k + j is the j-th expert choice of a token.
struct MoEParams {
  // The batch and its routing
  const long long* topk_ids;     // [slots] expert of each slot; ids outside [0, num_experts) live on another rank
  const float* topk_weights;     // [slots] fp32 routing weight of each slot
  const void* router_logits;     // [tokens, num_experts] of the activations' type, or null; given, the one-token
                                 // kernels take the softmax top-k themselves (one_token.cuh: topk_ids and
                                 // topk_weights unused)
  int renormalize;               // with router_logits: the top-k weights divided by their sum
  int tokens;
  int top_k;
  int slots;                     // tokens * top_k
  int num_experts;               // experts of this rank
  int hidden;                    // H: model width (GEMM 1's K, GEMM 2's output rows)
  int inter;                     // I: expert width (GEMM 1's output rows per half, GEMM 2's K)
  // The routing index, written by routing.cuh before the GEMMs
  int* sorted_slot;              // [slots] original slot at each sorted position (slots grouped by expert)
  float* sorted_weight;          // [slots] routing weight at each sorted position (GEMM 2 reads it beside the slot)
  int* tiles;                    // [num_tiles, 4]: expert, first sorted position, slots (0: no work; the grid is
                                 // sized from shapes), unused: one 16-byte record per tile, read in one load
  int* chunk_counts;             // [chunks, num_experts] per-chunk counts, then first positions (chunks > 0)
  int token_tile;                // BN: most slots of one expert per token tile (one tile map for both GEMMs)
  int num_tiles;
  int chunks;                    // 0: one block counts and scatters; else blocks of ROUTE_CHUNK slots
  int few_token_map;             // 1: GEMM 1 works its tile map out from topk_ids (few_tokens.cuh; the plan decides)
  // GEMM 1, gate and up: act = SiLU(x W1^T) * (x W3^T)
  PackedExperts w13;
  const void* x;                 // [tokens, hidden], read in place through the routing index
  void* x_fp8;                   // FP8 activations: x as e4m3 bytes [tokens, hidden] (quantize.cuh), else null
  float* x_scale;                // FP8 activations: [tokens] the scale of each row of x_fp8
  void* act;                     // [slots, inter] by sorted position
  float* gate_up_partial;        // [gate_up_splits, slots, 2 inter] fp32 split-K partial sums (gate | up), or null
  int gate_up_splits;            // split-K factor of GEMM 1 (its gridDim.z)
  // GEMM 2, down: y[slot] = topk_weight[slot] * W2 act
  PackedExperts w2;
  void* act_fp8;                 // FP8 activations: act as e4m3 bytes [slots, inter], else null
  float* act_scale;              // FP8 activations: [slots] the scale of each row of act_fp8
  void* y;                       // [down_splits, slots, hidden]: the activations' dtype, fp32 partials when split
  int down_splits;               // split-K factor of GEMM 2 (its gridDim.z)
  // The sum over each token's top-k slots
  void* out;                     // [tokens, hidden]
};

}  // namespace samoyeds
