"""Times the MoE op with each split-K pair (z1 for gate/up, z2 for down) forced at decode batch sizes, on a GPU.

    python benchmarks/compare_splits.py [--shapes qwen3-30b-a3b,...] [--patterns samoyeds,2:4] [--tokens 1,2,4,8,16]
        [--json FILE]

One problem per (shape, pattern, T); every variant is checked against the fp32 reference, then timed in two
rounds (all variants, then all again), each in the second of two CUDA graphs (bench.time_cuda_graph), so
neither the order nor the first-capture effect favours one. "default" is what `kernels._splits` chooses.
"""

import argparse
import itertools
import json

import torch

from samoyeds_vllm import kernels
from samoyeds_vllm.bench import make_problem, ours, preset_shape, reference_moe, relative_error, time_cuda_graph
from samoyeds_vllm.formats import Pattern

SPLITS = [None] + list(itertools.product((1, 2, 4), (1, 3)))


def forced_splits(pair):
    """A _splits that returns pair[0] for the first GEMM of each forward and pair[1] for the second, and records
    the default's choice in `chosen`."""
    calls = itertools.count()
    chosen = []
    default = kernels._splits

    def splits(*args):
        z = default(*args)
        chosen.append(z)
        return z if pair is None else min(pair[next(calls) % 2], args[4])  # never more splits than k tiles
    return splits, chosen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="qwen3-30b-a3b,mixtral-8x7b,qwen1.5-moe-a2.7b,deepseek-v2-lite,olmoe-1b-7b")
    parser.add_argument("--patterns", default="samoyeds,2:4")
    parser.add_argument("--tokens", default="1,2,4,8,16")
    parser.add_argument("--json")
    args = parser.parse_args()
    default = kernels._splits
    rows = []
    for shape_name, pattern_name, tokens in itertools.product(args.shapes.split(","), args.patterns.split(","),
                                                               map(int, args.tokens.split(","))):
        shape, pattern = preset_shape(shape_name), Pattern.parse(pattern_name)
        problem = make_problem(shape, pattern, tokens, seed=tokens)
        ref = reference_moe(problem)
        fn = ours(problem, pattern)
        cells = {}
        for rnd in range(2):
            for pair in SPLITS:
                kernels._splits, chosen = forced_splits(pair)
                try:
                    if rnd == 0:
                        err = relative_error(fn(), ref)
                        assert err < 1e-2, f"{pair}: relative error {err}"
                    us = time_cuda_graph(fn)
                finally:
                    kernels._splits = default
                name = f"default {tuple(chosen[:2])}" if pair is None else str(pair)
                cells.setdefault(name, []).append(round(us, 1))
        best = min(cells, key=lambda k: min(cells[k]))
        print(f"{shape_name} {pattern_name} T={tokens}: " + "  ".join(f"{k} {v[0]}/{v[1]}" for k, v in cells.items())
              + f"  best {best}")
        rows.append({"shape": shape_name, "pattern": pattern_name, "tokens": tokens, "us": cells})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
