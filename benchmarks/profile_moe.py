"""Where the time of one sparse MoE forward goes, kernel by kernel (torch.profiler / CUPTI), on a GPU.

python benchmarks/profile_moe.py [--shape qwen3-30b-a3b] [--pattern samoyeds] [--tokens 16,256] [--values fp8]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from samoyeds_vllm.format import FP8, Pattern
from samoyeds_vllm.tools.moe_problem import make_problem, run_sparse
from samoyeds_vllm.tools.presets import preset_shape


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--pattern", default="samoyeds")
    parser.add_argument("--tokens", default="16,256")
    parser.add_argument("--values", choices=["bf16", "fp8"], default="bf16")
    args = parser.parse_args()
    shape = preset_shape(args.shape)
    pattern = Pattern.parse(args.pattern)
    for tokens in map(int, args.tokens.split(",")):
        problem = make_problem(shape, pattern, tokens, seed=tokens, values=FP8 if args.values == "fp8" else None)

        def fn(problem=problem):
            return run_sparse(problem)

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        print(f"--- {args.shape} {pattern} {args.values} T={tokens} (10 calls)")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))


if __name__ == "__main__":
    main()
