// Streaming weights from DRAM into shared memory on Hopper, the ways the ws GEMM's copier can (copy_bandwidth.py):
// the rate each reaches without the MMAs. Every block takes pipeline stages of STAGE_BYTES in turn (block b the
// stages b, b + gridDim.x, ...), one block per SM as the ws kernel; a consumer warpgroup pair (256 threads, the MMA
// warpgroups' place) waits for each stage, adds its words into a checksum and frees it.
#include "ptx.cuh"

using namespace samoyeds;

__device__ __forceinline__ void add_to_checksum(unsigned long long sum, unsigned long long* checksum) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(checksum, sum);
}

// BULK: the copier's first thread copies a stage as CHUNK-byte bulk copies; else its 128 threads copy it in 16-byte
// cp.async and arrive once theirs landed, as the ws kernel's copier does.
template <bool BULK, int STAGES, int STAGE_BYTES, int CHUNK>
__global__ void __launch_bounds__(384, 1)
    stream_stages(const uint4* __restrict__ src, long long total_stages, unsigned long long* checksum) {
  static_assert(STAGE_BYTES % CHUNK == 0 && CHUNK % 16 == 0, "whole chunks of whole 16-byte pieces");
  constexpr int PIECES = STAGE_BYTES / 16;
  extern __shared__ __align__(128) unsigned char smem[];  // STAGES x STAGE_BYTES
  __shared__ unsigned long long full[STAGES], empty[STAGES];
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], BULK ? 1 : 128);
      mbar_init(&empty[s], 256);
    }
  }
  __syncthreads();
  const long long mine = (total_stages - blockIdx.x + gridDim.x - 1) / gridDim.x;
  if (tid < 128) {
    for (long long k = 0; k < mine; ++k) {
      const int slot = k % STAGES;
      if (k >= STAGES) mbar_wait(&empty[slot], (k / STAGES - 1) & 1);
      const uint4* from = src + (blockIdx.x + k * gridDim.x) * PIECES;
      uint4* to = reinterpret_cast<uint4*>(smem + slot * STAGE_BYTES);
      if constexpr (BULK) {
        if (tid == 0) {
          mbar_arrive_expect_tx(&full[slot], STAGE_BYTES);
          for (int c = 0; c < STAGE_BYTES / CHUNK; ++c)
            bulk_copy(to + c * (CHUNK / 16), from + c * (CHUNK / 16), CHUNK, &full[slot]);
        }
      } else {
        for (int i = tid; i < PIECES; i += 128) cp_async16(to + i, from + i, 16);
        mbar_arrive_on_copies(&full[slot]);
      }
    }
  } else {
    unsigned long long sum = 0;
    for (long long k = 0; k < mine; ++k) {
      const int slot = k % STAGES;
      mbar_wait(&full[slot], (k / STAGES) & 1);
      const uint4* stage = reinterpret_cast<const uint4*>(smem + slot * STAGE_BYTES);
      for (int i = tid - 128; i < PIECES; i += 256) {
        const uint4 v = stage[i];
        sum += (unsigned long long)v.x + v.y + v.z + v.w;
      }
      mbar_arrive(&empty[slot]);
    }
    add_to_checksum(sum, checksum);
  }
}

// The reference: every thread's U 16-byte loads in flight into registers, as many threads as the SMs hold.
template <int U>
__global__ void __launch_bounds__(512) stream_loads(const uint4* __restrict__ src, long long pieces,
                                                    unsigned long long* checksum) {
  unsigned long long sum = 0;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long base = blockIdx.x * (long long)blockDim.x * U + threadIdx.x; base < pieces; base += step * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = base + (long long)u * blockDim.x;
      v[u] = i < pieces ? src[i] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) sum += (unsigned long long)v[u].x + v[u].y + v[u].z + v[u].w;
  }
  add_to_checksum(sum, checksum);
}
