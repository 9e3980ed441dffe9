"""`samoyeds-vllm bench moe`: our sparse MoE layer against vLLM's dense fused MoE, same inputs, one process.

For each token count: random dense expert weights of a real model shape (configs/models), pruned and packed for
ours (tools/moe_problem.py); the same activations and routing for both; a correctness check of both against the
fp32 dense matmul of the (pruned / dense) weights; then each captured in a CUDA graph and timed by replaying it.
Achieved bandwidth and dense-equivalent TFLOP/s are reported against ceilings measured on the same GPU in the
same run.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..format import Pattern
from ..tools.moe_problem import MoEProblem, make_problem, reference, relative_error, run_sparse
from ..tools.presets import preset_shape
from .timing import measure_ceilings, time_cuda_graph_captures

DEFAULT_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)


def vllm_dense(p: MoEProblem):
    """vLLM's fused MoE (its Triton kernels and tuned configs) on the problem's dense weights."""
    from vllm.model_executor.layers.fused_moe import fused_experts

    ids = p.topk_ids.to(torch.int32)
    return lambda: fused_experts(p.x, p.w13, p.w2, p.topk_weights, ids)


def _bytes_read(p: MoEProblem, sparse: bool) -> int:
    """Fewest bytes the layer must move: the weights of every expert with tokens (packed or dense), x, out."""
    used = p.topk_ids.unique().numel()
    if sparse:
        per_expert = sum(t[0].numel() * t.element_size() for t in (*p.packed13, *p.packed2) if t is not None)
    else:
        per_expert = (p.w13[0].numel() + p.w2[0].numel()) * p.w13.element_size()
    return used * per_expert + 2 * p.x.numel() * p.x.element_size()


def bench_moe(
    shape_name: str,
    tokens: list[int],
    pattern: Pattern,
    dtype=torch.bfloat16,
    json_path: Path | None = None,
    with_vllm: bool = True,
    values: torch.dtype | None = None,
) -> list[dict]:
    """values FP8: ours with FP8 values, beside ours with values of dtype (the same pruned weights; `ours_bf16_*`) and
    its error against that unquantized layer (`ours_vs_unquantized_err`)."""
    from tqdm import tqdm

    shape = preset_shape(shape_name)
    if with_vllm:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vLLM is not importable here: timing ours only")
            with_vllm = False
    ceilings = measure_ceilings()
    rows = []
    for t in tqdm(tokens, desc=f"bench moe {shape_name} {pattern}"):
        problem = make_problem(shape, pattern, t, dtype, seed=t, values=values)
        row = {"tokens": t, "ours_rel_err": relative_error(run_sparse(problem), reference(problem))}
        row["ours_first_capture_us"], row["ours_us"] = time_cuda_graph_captures(lambda p=problem: run_sparse(p))
        if values is not None:
            unquantized = make_problem(shape, pattern, t, dtype, seed=t)
            row["ours_vs_unquantized_err"] = relative_error(run_sparse(problem), reference(unquantized))
            row["ours_bf16_us"] = time_cuda_graph_captures(lambda p=unquantized: run_sparse(p))[1]
            del unquantized
        flops = 2 * t * shape.top_k * 3 * shape.hidden * shape.intermediate
        row["ours_TBps"] = _bytes_read(problem, True) / (row["ours_us"] * 1e-6) / 1e12
        row["ours_TFLOPs_dense_equiv"] = flops / (row["ours_us"] * 1e-6) / 1e12
        if with_vllm:
            dense = make_problem(shape, None, t, dtype, seed=t)  # same x and routing, unpruned weights
            row["vllm_rel_err"] = relative_error(vllm_dense(dense)(), reference(dense))
            row["vllm_first_capture_us"], row["vllm_us"] = time_cuda_graph_captures(vllm_dense(dense))
            row["vllm_TBps"] = _bytes_read(dense, False) / (row["vllm_us"] * 1e-6) / 1e12
            row["vllm_TFLOPs"] = flops / (row["vllm_us"] * 1e-6) / 1e12
            row["speedup"] = row["vllm_us"] / row["ours_us"]
            del dense
        rows.append(row)
        del problem
        torch.cuda.empty_cache()
    result = {
        "shape": shape_name,
        **asdict(shape),
        "pattern": str(pattern),
        "dtype": str(dtype),
        "values": str(values or dtype),
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "vllm": _version("vllm"),
        "host": platform.node(),
        "ceilings": ceilings,
        "rows": rows,
    }
    print(format_table(result))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return rows


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None


def format_table(result: dict) -> str:
    c = result["ceilings"]
    lines = [
        f"{result['shape']} (E={result['num_experts']}, H={result['hidden']}, I={result['intermediate']}, "
        f"top-{result['top_k']}), {result['pattern']}, {result['dtype']} on {result['device']} "
        f"(copy {c['copy_TBps']:.2f} TB/s, bf16 matmul {c['bf16_matmul_TFLOPs']:.0f} TFLOP/s)",
        f"{'T':>6} {'ours µs':>9} {'vLLM µs':>9} {'speedup':>8} {'ours TB/s':>9} {'vLLM TB/s':>9} "
        f"{'ours TF/s':>9} {'vLLM TF/s':>9} {'err ours':>9} {'err vLLM':>9}",
    ]
    if "ours_bf16_us" in result["rows"][0]:
        lines[0] += f", values {result['values']}"
        lines[1] += f" {'unquant. µs':>11} {'err vs unquant.':>15}"
    for r in result["rows"]:
        lines.append(
            f"{r['tokens']:>6} {r['ours_us']:>9.1f} {r.get('vllm_us', float('nan')):>9.1f} "
            f"{r.get('speedup', float('nan')):>7.2f}x {r['ours_TBps']:>9.2f} "
            f"{r.get('vllm_TBps', float('nan')):>9.2f} {r['ours_TFLOPs_dense_equiv']:>9.1f} "
            f"{r.get('vllm_TFLOPs', float('nan')):>9.1f} {r['ours_rel_err']:>9.1e} "
            f"{r.get('vllm_rel_err', float('nan')):>9.1e}"
        )
        if "ours_bf16_us" in r:
            lines[-1] += f" {r['ours_bf16_us']:>11.1f} {r['ours_vs_unquantized_err']:>15.1e}"
    return "\n".join(lines)
