"""What one MoE layer costs the host when vLLM runs a step without CUDA graphs (batches past its largest captured
size, e.g. a serving step that mixes several prefills into the decodes), against vLLM's FP8 MoE, on a GPU.

    python benchmarks/host_overhead.py [--shape qwen3-30b-a3b] [--tokens 256,640,1024,4096] [--json FILE]
        [--profile FILE]

Per path and T: the host's µs per call (the Python and launches, timed over a few calls that the GPU's launch queue
takes without blocking), the µs per call of back-to-back eager calls (the larger of host and GPU), and the µs in a
CUDA graph (the GPU alone). Where the host exceeds the graph time, steps without CUDA graphs wait on the host.
"""

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from samoyeds_vllm.bench.layer import run_header
from samoyeds_vllm.bench.peers import PEERS, PeerInputs
from samoyeds_vllm.bench.timing import time_cuda_graph
from samoyeds_vllm.format import FP8, Pattern
from samoyeds_vllm.tools.moe_problem import make_problem, run_sparse
from samoyeds_vllm.tools.presets import preset_shape

HOST_CALLS = 10  # ~100 launches: well inside the launch queue, so enqueueing never waits on the GPU
EAGER_CALLS = 100


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(host µs per call, wall µs per call up to the GPU's end) of `calls` back-to-back calls."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    return (enqueued - start) / calls * 1e6, (time.perf_counter() - start) / calls * 1e6


def measure(fn) -> dict:
    for _ in range(5):
        fn()
    host = min(per_call_us(fn, HOST_CALLS)[0] for _ in range(5))
    eager = min(per_call_us(fn, EAGER_CALLS)[1] for _ in range(3))
    return {"host_us": round(host, 1), "eager_us": round(eager, 1), "graph_us": round(time_cuda_graph(fn), 1)}


def profile(fn, path: str, label: str) -> None:
    """cProfile of HOST_CALLS calls of fn (by internal time, first 30 rows) written to path."""
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(HOST_CALLS):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    Path(path).write_text(f"# cProfile of {HOST_CALLS} calls: {label}\n{text.getvalue()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--pattern", default="samoyeds")
    parser.add_argument("--tokens", default="256,640,1024,4096")
    parser.add_argument("--peer", default="fp8-triton", help="a bench moe peer (default: vLLM's FP8 Triton MoE)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--profile", help="write a cProfile of our layer's calls at the first T here")
    args = parser.parse_args()
    shape, pattern = preset_shape(args.shape), Pattern.parse(args.pattern)
    rows = []
    print(f"{'T':>6}  {'path':<26} {'host µs':>8} {'eager µs':>9} {'graph µs':>9}")
    for tokens in map(int, args.tokens.split(",")):
        sparse = make_problem(shape, pattern, tokens, seed=tokens, values=FP8)
        paths = {f"ours {pattern} fp8": measure(lambda p=sparse: run_sparse(p))}
        if args.profile and not rows:
            profile(lambda p=sparse: run_sparse(p), args.profile, f"ours {pattern} fp8, {args.shape}, T = {tokens}")
        del sparse
        dense = make_problem(shape, None, tokens, seed=tokens)
        peer = PEERS[args.peer].build(PeerInputs(dense))
        paths[PEERS[args.peer].label] = measure(peer.run)
        del dense, peer
        torch.cuda.empty_cache()
        for name, row in paths.items():
            print(f"{tokens:>6}  {name:<26} {row['host_us']:>8} {row['eager_us']:>9} {row['graph_us']:>9}")
            rows.append({"tokens": tokens, "path": name, **row})
    if args.json:
        record = {**run_header(args.shape, shape, pattern, torch.bfloat16), "peer": args.peer, "rows": rows}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
