"""How fast can the SMs pull bytes out of L2 into shared memory? The ceiling our Hopper GEMMs' copy side runs
against (their copier warpgroup fills shared-memory stages with cp.async from L2-resident weights and gathered
token rows).

    python benchmarks/l2_ceiling.py [--mib 16] [--json FILE]

Each block streams 16 KB chunks of an L2-resident buffer into a ring of shared-memory stages with 16-byte
cp.async (a commit group per chunk, `stages - 1` groups in flight), over a grid of one or two blocks per SM.
"contiguous" chunks are 16 KB runs; "rows" chunks are 64 rows of 256 B at random row positions of 4 KB rows
(the B tile of one 128-input stage of a 64-token tile). Prints TB/s of bytes landed in shared memory.
"""

import argparse
import json

import cupy
import numpy as np

SOURCE = r"""
template <int THREADS, int STAGES, bool ROWS>
__global__ void __launch_bounds__(THREADS) stream_l2(const char* __restrict__ src, const int* __restrict__ rows,
                                                     int chunks, int total, unsigned long long* sink) {
    extern __shared__ __align__(128) char smem[];
    constexpr int CHUNK = 16384, PER_THREAD = CHUNK / 16 / THREADS;
    unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    int stage = 0;
    for (int c = blockIdx.x; c < total; c += gridDim.x) {
        int chunk = c % chunks;
        #pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            int v = threadIdx.x + i * THREADS;  // 16-byte vector of the chunk
            const char* from;
            if (ROWS) {  // 64 rows x 256 B: row v / 16, 16 B piece v % 16
                from = src + static_cast<size_t>(rows[chunk * 64 + v / 16]) * 4096 + (v % 16) * 16;
            } else {
                from = src + static_cast<size_t>(chunk) * CHUNK + v * 16;
            }
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                         :: "r"(base + stage * CHUNK + v * 16), "l"(from));
        }
        asm volatile("cp.async.commit_group;\n");
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
        stage = (stage + 1) % STAGES;
    }
    asm volatile("cp.async.wait_group 0;\n");
    __syncthreads();
    if (threadIdx.x == 0) sink[blockIdx.x] = *reinterpret_cast<unsigned long long*>(smem);
}
"""

CONFIGS = [(threads, stages, rows) for rows in (False, True) for threads in (128, 256) for stages in (2, 4, 8)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=16, help="buffer size (L2-resident: H100 L2 is 50 MB)")
    parser.add_argument("--json")
    args = parser.parse_args()
    names = [f"stream_l2<{t}, {s}, {str(r).lower()}>" for t, s, r in CONFIGS]
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=names)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    buf = cupy.random.randint(0, 255, args.mib << 20, dtype=cupy.uint8)
    chunks = (args.mib << 20) // 16384
    rows = cupy.random.randint(0, (args.mib << 20) // 4096, chunks * 64, dtype=cupy.int32)
    sink = cupy.zeros(4 * sms, dtype=cupy.uint64)
    results = []
    print(f"{'threads':>7} {'stages':>6} {'pattern':>10} {'blocks/SM':>9} {'TB/s':>6}")
    for (threads, stages, gather), name in zip(CONFIGS, names):
        kernel = module.get_function(name)
        kernel.max_dynamic_shared_size_bytes = stages * 16384
        for per_sm in (1, 2):
            if per_sm * stages * 16384 > 220 * 1024:
                continue
            grid, total = sms * per_sm, chunks * 200
            launch = lambda: kernel((grid,), (threads,), (buf, rows, np.int32(chunks), np.int32(total), sink),
                                    shared_mem=stages * 16384)
            launch()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            times = []
            for _ in range(5):
                start.record()
                launch()
                end.record()
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
            tbps = total * 16384 / float(np.median(times)) / 1e12
            pattern = "rows" if gather else "contiguous"
            print(f"{threads:>7} {stages:>6} {pattern:>10} {per_sm:>9} {tbps:>6.2f}")
            results.append({"threads": threads, "stages": stages, "pattern": pattern, "blocks_per_sm": per_sm,
                            "TBps": tbps})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "mib": args.mib,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
