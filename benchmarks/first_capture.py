"""Why does the first CUDA graph of a new MoE problem time slower than later captures of the same call?

    python benchmarks/first_capture.py [--shape qwen3-30b-a3b] [--pattern samoyeds] [--tokens 16] [--json FILE]

Seen on an H100 (NOTES.md, "The first CUDA graph of a problem times slow"): Qwen3 samoyeds T = 16 read 110.5 µs in
the first graph, 99.1-99.5 in four more. Each experiment below makes a fresh problem (new weights and inputs) and
prints µs per replay (median of 7 repeats of 20 replays):
- sequential: capture and time, four times;
- reverse: capture two graphs, then time the second before the first;
- shared-pool: four captures sharing one memory pool (as vLLM captures its graphs);
- eager-first: 200 eager calls before the first capture;
- one graph timed 4x: one capture, timed four times;
- clocks: as "one graph timed 4x", with the SM clock (a clock64 spin of a million cycles timed by events) read
  before each timing;
- spin-first: all SMs spinning for 200 ms between the capture and the first timing;
- decay: right after a capture, 12 single repeats (20 replays each), each followed by an SM clock reading.
"""

import argparse
import json

import cupy
import torch

from samoyeds_vllm.bench import capture_graph, make_problem, ours, preset_shape, time_graph
from samoyeds_vllm.formats import Pattern


SPIN = cupy.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}""", "spin")


def spin(cycles: int, blocks: int = 1) -> float:
    """Runs `cycles` SM clocks on `blocks` blocks; returns the elapsed µs."""
    torch.cuda.synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    SPIN((blocks,), (32,), (cupy.int64(cycles),))
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1000


def sm_mhz() -> float:
    return round(1_000_000 / spin(1_000_000), 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--pattern", default="samoyeds")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    shape, pattern = preset_shape(args.shape), Pattern.parse(args.pattern)
    seeds = iter(range(100, 200))

    def fresh():
        return ours(make_problem(shape, pattern, args.tokens, seed=next(seeds)), pattern)

    results = {}
    fn = fresh()
    results["sequential"] = [time_graph(capture_graph(fn)) for _ in range(4)]
    fn = fresh()
    first, second = capture_graph(fn), capture_graph(fn)
    results["reverse (second, then first)"] = [time_graph(second), time_graph(first)]
    fn, pool = fresh(), torch.cuda.graph_pool_handle()
    results["shared-pool"] = [time_graph(capture_graph(fn, pool)) for _ in range(4)]
    fn = fresh()
    for _ in range(200):
        fn()
    results["eager-first"] = [time_graph(capture_graph(fn)) for _ in range(4)]
    fn = fresh()
    graph = capture_graph(fn)
    results["one graph timed 4x"] = [time_graph(graph) for _ in range(4)]
    graph = capture_graph(fresh())
    results["clocks: MHz, then µs"] = [value for _ in range(4) for value in (sm_mhz(), time_graph(graph))]
    graph = capture_graph(fresh())
    spin(300_000_000, 4 * torch.cuda.get_device_properties(0).multi_processor_count)  # ~200 ms at 1.5 GHz
    results["spin-first"] = [time_graph(graph) for _ in range(4)]
    sm_mhz()  # compiled and loaded before the capture below
    graph = capture_graph(fresh())
    results["decay: µs, then MHz"] = [value for _ in range(12) for value in (time_graph(graph, repeats=1), sm_mhz())]
    for name, values in results.items():
        print(f"{args.shape} {pattern} T={args.tokens} {name:32s} " + " ".join(f"{v:7.1f}" for v in values))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "pattern": str(pattern), "tokens": args.tokens,
                       "device": torch.cuda.get_device_name(), "us": results}, f, indent=2)


if __name__ == "__main__":
    main()
