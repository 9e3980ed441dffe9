"""How fast the ws GEMM's copier could stream weights from DRAM into shared memory, by the copy it issues
(copy_bandwidth.cu), without the MMAs: 16-byte cp.async from 128 threads (what the ws kernel does) against the TMA
engine's bulk copies from one thread, per pipeline depth and stage size, beside plain loads into registers (the
reference). At T = 256 the FP8 ws GEMMs read their weights at 51-64% of the H200's DRAM peak (ncu,
docs/benchmarks.md): if cp.async alone tops out near there and bulk copies do not, the copier's copies are the lever.

    python benchmarks/copy_bandwidth.py [--mb 2048] [--repeats 10] [--json FILE]

Every configuration first runs once and its checksum (the sum of the 32-bit words the consumers read out of shared
memory) must equal the buffer's; then it is timed over `repeats` launches with CUDA events. Prints a table (TB/s, and
against the loads' rate) and writes the JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from importlib import resources
from pathlib import Path

STAGE_SHAPES = [(6, 28 * 1024), (6, 36 * 1024), (4, 52 * 1024)]  # the ws kernel's: FP8 x FP8, FP8 values, bf16 (BN 64)
CHUNKS = [1024, 4096]  # a slab's stage of metadata, of FP8 values
LOADS_IN_FLIGHT = 4


def configs() -> list[tuple[str, str, int, int]]:
    """(name, kernel, stages, stage bytes) of every copy timed; the loads first (no stages)."""
    out = [("loads into registers", f"stream_loads<{LOADS_IN_FLIGHT}>", 0, 0)]
    for (stages, stage_bytes), bulk in itertools.product(STAGE_SHAPES, (False, True)):
        for chunk in CHUNKS if bulk else [16]:
            name = f"{'bulk' if bulk else 'cp.async'} {stages} x {stage_bytes // 1024} KB" + (
                f", {chunk // 1024} KB copies" if bulk else ""
            )
            kernel = f"stream_stages<{'true' if bulk else 'false'}, {stages}, {stage_bytes}, {chunk}>"
            out.append((name, kernel, stages, stage_bytes))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=2048, help="bytes streamed per launch, MiB (well past the L2)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    import cupy

    device = cupy.cuda.Device()
    sms = device.attributes["MultiProcessorCount"]
    name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"].decode()
    csrc = resources.files("samoyeds_vllm.csrc")
    timed = configs()
    module = cupy.RawModule(
        code=(Path(__file__).parent / "copy_bandwidth.cu").read_text(),
        options=("--gpu-architecture=sm_90a", "-std=c++17", f"--include-path={csrc}"),
        name_expressions=[kernel for _, kernel, _, _ in timed],
    )
    whole = math.lcm(*(b for _, b in STAGE_SHAPES))  # every stage size divides the buffer: each copies it all
    total = max(args.mb * 1024 * 1024 // whole, 1) * whole
    words = cupy.random.randint(0, 2**30, size=total // 4, dtype=cupy.int32)
    expected = int(words.astype(cupy.uint64).sum())
    checksum = cupy.zeros(1, dtype=cupy.uint64)

    rows = []
    for key, expression, stages, stage_bytes in timed:
        function = module.get_function(expression)
        if not stages:
            grid, block, shared = 4 * sms, 512, 0
            launch_args = (words, cupy.int64(total // 16), checksum)
        else:
            shared = stages * stage_bytes
            function.max_dynamic_shared_size_bytes = shared
            grid, block = sms, 384
            launch_args = (words, cupy.int64(total // stage_bytes), checksum)

        def launch(function=function, grid=grid, block=block, shared=shared, launch_args=launch_args):
            function((grid,), (block,), launch_args, shared_mem=shared)

        checksum.fill(0)
        launch()
        got = int(checksum.get()[0])
        if got != expected:
            raise AssertionError(f"{key}: checksum {got} against the buffer's {expected}: a stage was not copied whole")
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(args.repeats):
            launch()
        end.record()
        end.synchronize()
        seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3 / args.repeats
        rows.append(
            {"copy": key, "kernel": expression, "bytes": total, "us": seconds * 1e6, "tb_s": total / seconds / 1e12}
        )

    reference = rows[0]["tb_s"]
    print(f"{name}, {sms} SMs, {total / 2**20:.0f} MiB a launch, mean of {args.repeats} launches")
    print(f"{'copy':<40} {'TB/s':>6} {'x loads':>8}")
    for row in rows:
        row["of_loads"] = row["tb_s"] / reference
        print(f"{row['copy']:<40} {row['tb_s']:>6.2f} {row['of_loads']:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "sms": sms, "rows": rows}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
