"""Times the MoE op with one GEMM forced to each compiled block shape (warps, slabs) on wide batches, on a GPU.

    python benchmarks/compare_tilings.py [--gemm 2] [--shape qwen3-30b-a3b] [--pattern samoyeds] \
        [--tokens 1024,4096,16384]

Checks each variant against the fp32 reference before timing it (same inputs for all variants). These are the
64-token-tile shapes; 2:4 on Hopper takes 128-token tiles (one shape, the warp-specialised kernel) from about
128 slots per expert, where no variant is forced.
"""

import argparse

import torch

from samoyeds_vllm import kernels
from samoyeds_vllm.bench import make_problem, ours, preset_shape, reference_moe, relative_error, time_cuda_graph
from samoyeds_vllm.formats import Pattern


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemm", type=int, choices=(1, 2), default=2, help="1: gate/up, 2: down")
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--pattern", default="samoyeds")
    parser.add_argument("--tokens", default="1024,4096,16384")
    args = parser.parse_args()
    shape, pattern = preset_shape(args.shape), Pattern.parse(args.pattern)
    default_tiling = kernels._tiling
    gate_up = args.gemm == 1
    variants = kernels._tilings(kernels.WIDE_BN, gate_up, pattern.segment is not None,
                                kernels._arch(torch.device("cuda")) == "sm_90a")
    print(f"{args.shape} {pattern}: GEMM {args.gemm} block shapes (warps, slabs), µs")
    for tokens in map(int, args.tokens.split(",")):
        problem = make_problem(shape, pattern, tokens, seed=tokens)
        ref = reference_moe(problem)
        cells = []
        for warps, slabs, kind in variants:
            block_rows = 16 * warps * (1 if gate_up else slabs)

            def forced(bn, is_gate_up, samoyeds, hopper, rows, _shape=(warps, slabs, kind, block_rows)):
                if is_gate_up != gate_up or bn != kernels.WIDE_BN or rows % _shape[3]:
                    return default_tiling(bn, is_gate_up, samoyeds, hopper, rows)
                return _shape
            kernels._tiling = forced
            fn = ours(problem, pattern)
            err = relative_error(fn(), ref)
            name = f"{warps}x{slabs} {kind}"
            assert err < 1e-2, f"{name}: relative error {err}"
            cells.append(f"{name} {time_cuda_graph(fn):8.1f} (err {err:.1e})")
        kernels._tiling = default_tiling
        print(f"T={tokens:6d}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
