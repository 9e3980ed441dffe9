// Constants the kernels and their host code (samoyeds_vllm/kernels/) must agree on. This file is the only place
// they are written: kernels/geometry.py reads every `constexpr int NAME = value;` line below, so keep each one a
// plain integer literal on one line. Plain C++, so a host compiler can check it (tests/unit/test_kernel_contract.py).
#pragma once

namespace samoyeds {

constexpr int BK = 128;            // dense inputs per pipeline stage (4 sparse k-steps of 32)
constexpr int STAGES = 3;          // pipeline depth of moe_gemm (mma.sp and one-warpgroup wgmma.sp)
constexpr int SLAB_ROWS = 16;      // condensed weight rows per warp in a slab (one m16 tile)
constexpr int TILE_ROWS = 64;      // rows of a tile of the stored values and metadata (tiles.cuh, tiled_offset)

// The warp-specialised Hopper kernel (gemm_ws.cuh): pipeline depth by token-tile width, 4 x 52 KB (64 tokens) or
// 3 x 68 KB (128) of shared memory, one block per SM; FP8 values halve the A tile: 6 x 36 KB or 4 x 52 KB.
constexpr int WS_STAGES_BN64 = 4;
constexpr int WS_STAGES_BN128 = 3;
constexpr int WS_STAGES_BN64_FP8 = 6;
constexpr int WS_STAGES_BN128_FP8 = 4;
constexpr int WS_CONSUMERS = 2;    // MMA warpgroups per block, besides the copying one
constexpr int WS_SLAB = 64;        // condensed rows per m64 wgmma tile; each MMA warpgroup owns two

// The routing index (routing.cuh).
constexpr int MAX_EXPERTS = 1024;  // shared-memory counters of the one-block routing kernel
constexpr int ROUTE_THREADS = 256; // threads of the many-block count and scatter kernels
constexpr int ROUTE_ILP = 8;       // slot ids each thread has in flight
constexpr int ROUTE_CHUNK = 2048;  // slots per block of the count and scatter kernels
static_assert(ROUTE_CHUNK == ROUTE_THREADS * ROUTE_ILP, "one chunk is one pass of the block");
constexpr int FEW_TOKENS = 8;      // batches GEMM 1 maps itself (few_tokens.cuh): the narrowest token tile
constexpr int FEW_TOKEN_SLOTS = 32;  // ... and at most these slots (one lane each: few_tokens.cuh)
constexpr int ONE_TOKEN_STAGES = 4;  // depth of each warp's ring in the layer of one token (one_token.cuh)
constexpr int MAX_ROUTED_LOGITS = 256;  // experts whose top-k the one-token kernels take from the logits

// The slot sum (reduce.cuh): elements per thread for large batches (16 bytes of bf16 / fp16).
constexpr int SUM_VEC = 8;
constexpr int SUM_SLOTS_IN_FLIGHT = 8;  // slots whose loads a thread of 1 or 2 elements of the slot sum issues at once
constexpr int MAX_SPLITS = 8;      // split-K factor cap (the split-K SiLU loads every split's partials at once)
constexpr int ELEMENTWISE_THREADS = 256;  // threads per block of the split-K SiLU and the slot sum
constexpr int QUANTIZE_CHUNKS_IN_FLIGHT = 8;  // 16-byte chunks of a row each lane of quantize_rows loads together

}  // namespace samoyeds
