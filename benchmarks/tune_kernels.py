"""Times the MoE layer under kernel configs (split-K factors and block shapes) against the heuristics' plan, on a GPU,
and optionally writes the best of each token count as a tuned table that the kernels then read.

    python benchmarks/tune_kernels.py [--shapes qwen3-30b-a3b,...] [--patterns samoyeds,2:4] [--tokens 1,2,4,8,16]
        [--search splits|blocks|tiles|activations|all] [--values bf16|fp8] [--token-tile N] [--json FILE]
        [--write-tables DIR]

One problem per (shape, pattern, T). Every config is checked against the fp32 reference (with the activations
quantized where the config multiplies FP8 copies of them), then timed in two rounds (all configs, then all again),
each in the second of two CUDA graphs (bench/timing.py), so neither the order nor the first-capture effect favours
one. "splits" tries split-K factors (1, 2, 4) for gate/up x (1, 3) for down (never more than the k tiles allow);
"blocks" tries every compiled block shape of each GEMM at the heuristics' token tile; "tiles" tries every compiled
token tile (each with its preferred block shapes and the split-K rule); "activations" (FP8 values)
tries each GEMM with and without FP8 copies of its activations (FP8 x FP8 MMAs) where its block can, on top of the
shipped table's entry where there is one (so a tuned split keeps its place). --token-tile N searches within tiles
of N tokens (every config but "default", the heuristics' plan). The JSON records each config as a table entry, and
its error against the same layer with bf16 values (same seed: FP8 values' whole error).
--write-tables writes, per (shape, pattern), the best config of each token count in the format and file name of
configs/kernels/README.md; put them under configs/kernels/ (shipped) or point $SAMOYEDS_KERNEL_CONFIG_DIR at DIR.
"""

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

import torch

from samoyeds_vllm import kernels
from samoyeds_vllm.bench.timing import time_cuda_graph
from samoyeds_vllm.format import FP8, Pattern
from samoyeds_vllm.kernels import GemmConfig, KernelConfig, LayerShape
from samoyeds_vllm.kernels.plan import (
    block_shapes,
    device_of,
    fp8_activations_allowed,
    one_token_refusal,
    table_name,
    token_tiles,
    tuned_config,
)
from samoyeds_vllm.tools.moe_problem import error_against_plan, make_problem, reference, relative_error, run_sparse
from samoyeds_vllm.tools.presets import preset_shape


def candidates(
    plan: kernels.MoEPlan,
    k_tiles: tuple[int, int],
    pattern: Pattern,
    hopper: bool,
    search: str,
    fp8: bool,
    one_token: bool = False,
    tuned: KernelConfig | None = None,
    token_tile: int | None = None,
) -> list[tuple[str, KernelConfig]]:
    """(name, KernelConfig) to time. plan: the general path's plan (at one token "default" is the one-token kernels,
    and "general path" the heuristics' choices of the general path); tuned: the shipped table's entry, if any (the
    activations search varies it, so a tuned split keeps its place); token_tile: every searched config in tiles of
    that many tokens (plan already made with it), e.g. the split-K factors of a tile the heuristics do not pick."""
    samoyeds = pattern.is_samoyeds
    out = [("default", KernelConfig())]  # the heuristics (no tuned table)
    if one_token:
        out.append(("general path", KernelConfig(one_token=False)))
    if search in ("splits", "all"):
        for z1, z2 in itertools.product((1, 2, 4), (1, 3)):
            z1, z2 = min(z1, k_tiles[0]), min(z2, k_tiles[1])
            out.append((f"splits {z1},{z2}", KernelConfig(gate_up=GemmConfig(splits=z1), down=GemmConfig(splits=z2))))
    if search in ("blocks", "all"):
        for gate_up in (True, False):
            for b in block_shapes(plan.token_tile, gate_up, samoyeds, hopper, fp8):
                gemm = GemmConfig(b.kind, b.warps, b.slabs)
                config = (
                    KernelConfig(plan.token_tile, gate_up=gemm) if gate_up else KernelConfig(plan.token_tile, down=gemm)
                )
                out.append((f"{'gate/up' if gate_up else 'down'} {b.kind} {b.warps}x{b.slabs}", config))
    if search in ("tiles", "all"):
        for bn in token_tiles(samoyeds, hopper):
            out.append((f"token tile {bn}", KernelConfig(bn)))
    if search in ("activations", "all") and fp8:
        base = tuned or KernelConfig()
        if tuned is not None:
            out.append(("tuned table", tuned))
        allowed = [fp8_activations_allowed(gemm.block, pattern, fp8, hopper) for gemm in (plan.gate_up, plan.down)]
        for acts in itertools.product((False, True), repeat=2):
            if all(ok or not a for a, ok in zip(acts, allowed, strict=True)):
                name = f"fp8 activations gate/up {'on' if acts[0] else 'off'}, down {'on' if acts[1] else 'off'}"
                gemms = zip((base.gate_up, base.down), acts, strict=True)
                gate_up, down = (replace(c, fp8_activations=a) for c, a in gemms)
                name += " (tuned table's entry)" if tuned is not None else ""
                out.append((name, KernelConfig(base.token_tile, gate_up, down)))
    if token_tile is not None:  # "default" stays the heuristics' plan, the reference of the rest
        tiled = [(f"{name} (token tile {token_tile})", replace(c, token_tile=token_tile)) for name, c in out[1:]]
        out = out[:1] + tiled
    return list(dict(out).items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3-30b-a3b,mixtral-8x7b,qwen1.5-moe-a2.7b,deepseek-v2-lite,olmoe-1b-7b")
    parser.add_argument("--patterns", default="samoyeds,2:4")
    parser.add_argument("--tokens", default="1,2,4,8,16")
    parser.add_argument("--search", default="splits", choices=["splits", "blocks", "tiles", "activations", "all"])
    parser.add_argument("--values", default="bf16", choices=["bf16", "fp8"], help="the packed values' type")
    parser.add_argument("--token-tile", type=int, help="search within token tiles of this width (default: the plan's)")
    parser.add_argument("--json", help="write every timing here")
    parser.add_argument("--write-tables", metavar="DIR", help="write the best config per token count as tables")
    args = parser.parse_args()
    device = device_of(torch.device("cuda"))
    fp8 = args.values == "fp8"
    rows, tables = [], {}
    for shape_name, pattern_name, tokens in itertools.product(
        args.shapes.split(","), args.patterns.split(","), map(int, args.tokens.split(","))
    ):
        shape, pattern = preset_shape(shape_name), Pattern.parse(pattern_name)
        layer = LayerShape(tokens, shape.top_k, shape.num_experts, shape.hidden, shape.intermediate)
        one_token = one_token_refusal(layer) is None  # the one-token kernels can run (whatever a table's entry says)
        plan = kernels.plan_moe(layer, pattern, torch.bfloat16, device, fp8)
        if plan.one_token or args.token_tile:  # the general path's choices (in the asked tiles) are the ones to vary
            with kernels.override_config(KernelConfig(args.token_tile, one_token=False)):
                plan = kernels.plan_moe(layer, pattern, torch.bfloat16, device, fp8)
        problem = make_problem(shape, pattern, tokens, seed=tokens, values=FP8 if fp8 else None)
        # The references of the problem's (dequantized) weights, per choice of FP8 activations; with FP8 values
        # also the fp32 layer of the same problem with bf16 values, what quantizing costs in all.
        refs = {}
        unquantized = reference(make_problem(shape, pattern, tokens, seed=tokens)) if fp8 else None
        k_tiles = (shape.hidden // 128, shape.intermediate // 128)
        tuned = tuned_config(layer, pattern, torch.bfloat16, device, fp8)
        configs = candidates(plan, k_tiles, pattern, device.hopper, args.search, fp8, one_token, tuned, args.token_tile)
        cells: dict[str, list[float]] = {}
        errors: dict[str, float] = {}
        for rnd in range(2):
            for name, config in configs:
                with kernels.override_config(config):
                    if rnd == 0:
                        out = run_sparse(problem)
                        err, tol = error_against_plan(problem, out, refs)
                        assert err < tol, f"{shape_name} {pattern} T={tokens} {name}: relative error {err}"
                        if unquantized is not None:
                            errors[name] = round(relative_error(out, unquantized), 5)
                        del out
                    cells.setdefault(name, []).append(round(time_cuda_graph(lambda p=problem: run_sparse(p)), 1))
        del refs, unquantized
        best = min(cells, key=lambda k: min(cells[k]))
        print(
            f"{shape_name} {pattern} T={tokens}: "
            + "  ".join(f"{k} {v[0]}/{v[1]}" for k, v in cells.items())
            + f"  best {best}"
        )
        rows.append(
            {"shape": shape_name, "pattern": str(pattern), "values": args.values, "tokens": tokens, "us": cells}
            | ({"rel_err_unquantized": errors} if errors else {})
            | {"best": best, "configs": {name: config.to_json() for name, config in configs}}
        )
        best_config = dict(configs)[best]  # {} in the table: the heuristics won
        tables.setdefault(table_name(layer, pattern, torch.bfloat16, device, fp8), {})[str(tokens)] = (
            best_config.to_json()
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.name, "rows": rows}, indent=2) + "\n")
    if args.write_tables:
        out = Path(args.write_tables)
        out.mkdir(parents=True, exist_ok=True)
        for file, table in tables.items():
            (out / file).write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
            print(f"wrote {out / file}")


if __name__ == "__main__":
    main()
