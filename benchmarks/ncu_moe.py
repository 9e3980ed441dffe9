"""One MoE forward for Nsight Compute to profile (only the forward, between profiler start and stop), on a GPU.

    ncu --clock-control none --profile-from-start off [sections] python benchmarks/ncu_moe.py \
        [--shape qwen3-30b-a3b] [--pattern samoyeds] [--tokens 16384] [--values fp8]

With SAMOYEDS_LINEINFO=1 set, the kernels carry line info: `ncu --import REPORT --page source --csv --print-source
cuda,sass` then gives each SASS instruction's warp-state samples with its csrc line, which can be split by address
range into the copier, the MMA main loop and the epilogue (docs/benchmarks.md, "Profiling").
"""

import argparse

import torch

from samoyeds_vllm.format import FP8, Pattern
from samoyeds_vllm.tools.moe_problem import make_problem, run_sparse
from samoyeds_vllm.tools.presets import preset_shape


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--pattern", default="samoyeds")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--values", choices=["bf16", "fp8"], default="bf16")
    args = parser.parse_args()
    pattern = Pattern.parse(args.pattern)
    values = FP8 if args.values == "fp8" else None
    problem = make_problem(preset_shape(args.shape), pattern, args.tokens, seed=args.tokens, values=values)
    run_sparse(problem)  # compile and warm up outside the profiled range
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run_sparse(problem)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
