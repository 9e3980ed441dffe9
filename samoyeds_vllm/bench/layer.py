"""`samoyeds-vllm bench moe`: our sparse MoE layer against vLLM's MoE paths, same inputs, one process.

For each token count: random dense expert weights of a real model shape (configs/models), pruned and packed for
ours (tools/moe_problem.py); the same activations and routing for every path; each path checked against the fp32
dense product of its own weights, then captured in a CUDA graph and timed by replaying it. The peers are vLLM's
dense bf16 MoE and, with `--peers`, its FP8 block-128 paths and Marlin W4A16 (bench/peers.py). Achieved bandwidth
and dense-equivalent TFLOP/s are reported against ceilings measured on the same GPU in the same run.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import kernels
from ..format import FP8, PackedWeight, Pattern, decompress
from ..plugin.ops import moe_experts
from ..tools.moe_problem import MoEProblem, make_problem, quantized_by_experts, reference, relative_error, run_sparse
from ..tools.presets import preset_shape
from .peers import LEGACY_PEER, PEERS, MoEPath, format_paths_table, measure, run_peers, speedups, vllm_environment
from .quant import tensor_bytes
from .timing import measure_ceilings

DEFAULT_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)


@dataclass(frozen=True)
class OursVariant:
    """One of our layers: built from the pruned problem (its packed weights, or its own format of them)."""

    name: str  # JSON id, e.g. "ours-bf16"
    label: str  # table label
    build: Callable[[MoEProblem], MoEPath]


def ours_packed(p: MoEProblem, name: str, label: str) -> MoEPath:
    """The samoyeds op on the packed weights in the activations' dtype (the plugin's layer)."""
    per_expert = tensor_bytes(*(t[0] for t in (*p.packed13, *p.packed2) if t is not None))
    return MoEPath(name, label, lambda: run_sparse(p), lambda e: (p.w13[e], p.w2[e]), per_expert)


def _ours_fp8(p: MoEProblem, name: str, label: str) -> MoEPath:
    """The samoyeds op with the same kept weights quantized to FP8 values (one scale per output row)."""
    n13, n2 = (quantized_by_experts(w, p.pattern, FP8) for w in (p.packed13, p.packed2))

    def dequantized(expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(
            decompress(PackedWeight(*(t if t is None else t[expert] for t in q)), p.pattern) for q in (n13, n2)
        )

    q13, q2 = kernels.prepare_weights(n13), kernels.prepare_weights(n2)

    per_expert = tensor_bytes(*(t[0] for t in (*q13, *q2) if t is not None))
    run = lambda: moe_experts(p.x, p.topk_weights, p.topk_ids, q13, q2, p.pattern)  # noqa: E731
    return MoEPath(name, label, run, dequantized, per_expert)


def our_variants(pattern: Pattern, dtype: torch.dtype, fp8: bool = False) -> list[OursVariant]:
    """Our layers to time. The first one is what the legacy ours_* keys and the first table report and must run;
    fp8 adds the same kept weights with FP8 values ("ours-fp8"); a failure of one but the first is recorded."""
    name, label = "ours-bf16", f"ours {pattern} {_DTYPE_NAMES.get(dtype, str(dtype))}"
    variants = [OursVariant(name, label, lambda p: ours_packed(p, name, label))]
    if fp8:
        label8 = f"ours {pattern} fp8"
        variants.append(OursVariant("ours-fp8", label8, lambda p: _ours_fp8(p, "ours-fp8", label8)))
    return variants


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def bench_moe(
    shape_name: str,
    tokens: list[int],
    pattern: Pattern,
    dtype=torch.bfloat16,
    json_path: Path | None = None,
    with_vllm: bool = True,
    peers: list[str] | None = None,
    fp8: bool = False,
) -> list[dict]:
    """`peers`: names of bench/peers.py's PEERS to time (default: vLLM's bf16 MoE only); ignored without vLLM.
    `fp8`: also ours with FP8 values, with its error against ours with unquantized values
    (`rel_err_unquantized`)."""
    from tqdm import tqdm

    shape = preset_shape(shape_name)
    _expandable_segments_for(shape, dtype)
    if with_vllm:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vLLM is not importable here: timing ours only")
            with_vllm = False
    peers = (peers or [LEGACY_PEER]) if with_vllm else []
    variants = our_variants(pattern, dtype, fp8)
    ceilings = measure_ceilings()
    result = {
        **run_header(shape_name, shape, pattern, dtype),
        "ceilings": ceilings,
        "paths": {
            **{v.name: {"kind": "ours", "label": v.label} for v in variants},
            **{n: {"kind": "peer", "label": PEERS[n].label, "api": PEERS[n].api} for n in peers},
        },
        "rows": [],
    }
    for t in tqdm(tokens, desc=f"bench moe {shape_name} {pattern}"):
        _release()
        # what the previous token counts left on the GPU (workspaces, caches): where a large layer runs out of memory
        row = {"tokens": t, "gib_in_use_before": round(torch.cuda.memory_allocated() / 2**30, 2)}
        problem = make_problem(shape, pattern, t, dtype, seed=t)
        ours, outputs = [], []
        for n, variant in enumerate(variants):
            record = {"name": variant.name, "label": variant.label, "kind": "ours"}
            try:
                measured, out = measure(variant.build(problem), problem)
                record.update(status="ok", **measured)
            except Exception as e:
                if n == 0:
                    raise
                record.update(status="failed", reason=f"{type(e).__name__}: {e}"[:300])
                out = None
            ours.append(record)
            outputs.append(out)
        if outputs[0] is not None:  # the quantized variants against the same layer with unquantized values
            for record, out in zip(ours[1:], outputs[1:], strict=True):
                if out is not None:
                    record["rel_err_unquantized"] = relative_error(out, outputs[0].float())
        del problem
        _release()
        if peers:
            dense = make_problem(shape, None, t, dtype, seed=t)  # same x and routing, unpruned weights
            if "vllm_env" not in result:
                result["vllm_env"] = vllm_environment(dense)
            ref_bf16 = reference(dense)
            for record, out in zip(ours, outputs, strict=True):
                if out is not None:
                    record["rel_err_bf16_dense"] = relative_error(out, ref_bf16)
            row["paths"] = ours + run_peers(dense, peers, ref_bf16)
            del dense, ref_bf16
        else:
            row["paths"] = ours
        del outputs
        _release()
        row["best_peer"], row["speedups"] = speedups(row["paths"])
        row.update(_legacy_keys(row))
        result["rows"].append(row)
        if json_path:  # after every token count: a run cut short keeps what it measured
            Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    if len(variants) > 1 or len(peers) > 1:  # more than ours beside vLLM's bf16 MoE
        print(format_paths_table(result))
    return result["rows"]


def _expandable_segments_for(shape, dtype: torch.dtype, share: float = 0.1) -> None:
    """Lets PyTorch's allocator grow segments in place when one layer's dense weights take more than `share` of the
    GPU (DeepSeek-V3's 21 GiB on an 80 GB H100): each token count builds and frees problems of tens of GiB, and
    with fixed segments the freed ones stayed reserved in pieces (28 GiB allocated, 28 GiB reserved unused, the
    next 28 GiB refused). Only where the user has not set PYTORCH_CUDA_ALLOC_CONF."""
    if not torch.cuda.is_available():
        return
    weights = shape.num_experts * 3 * shape.hidden * shape.intermediate * torch.empty((), dtype=dtype).element_size()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if weights > share * total and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _legacy_keys(row: dict) -> dict:
    """The keys bench moe wrote before the peers (first ours variant, vLLM's bf16 MoE), which the layer tables in
    docs/benchmarks.md and benchmarks/results read."""
    paths = {r["name"]: r for r in row["paths"]}
    ours = row["paths"][0]
    keys = {
        "ours_rel_err": ours["rel_err_own"],
        "ours_first_capture_us": ours["first_capture_us"],
        "ours_us": ours["us"],
        "ours_TBps": ours["TBps"],
        "ours_TFLOPs_dense_equiv": ours["TFLOPs_dense_equiv"],
    }
    vllm = paths.get(LEGACY_PEER)
    if vllm is not None and vllm["status"] == "ok":
        keys.update(
            vllm_rel_err=vllm["rel_err_own"],
            vllm_first_capture_us=vllm["first_capture_us"],
            vllm_us=vllm["us"],
            vllm_TBps=vllm["TBps"],
            vllm_TFLOPs=vllm["TFLOPs_dense_equiv"],
            speedup=vllm["us"] / ours["us"],
        )
    return keys


def run_header(shape_name: str, shape, pattern: Pattern, dtype: torch.dtype) -> dict:
    """What a layer benchmark's JSON starts with: the layer shape and pattern, the GPU, the date and versions."""
    return {
        "shape": shape_name,
        **asdict(shape),
        "pattern": str(pattern),
        "dtype": str(dtype),
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "vllm": package_version("vllm"),
        "host": platform.node(),
    }


def package_version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None


def format_table(result: dict) -> str:
    """Ours (the first variant) per token count, beside vLLM's bf16 MoE where it ran (without vLLM, `--no-vllm`,
    ours' columns only)."""
    c = result["ceilings"]
    with_vllm = any("vllm_us" in r for r in result["rows"])
    nan = float("nan")
    lines = [
        f"{result['shape']} (E={result['num_experts']}, H={result['hidden']}, I={result['intermediate']}, "
        f"top-{result['top_k']}), {result['pattern']}, {result['dtype']} on {result['device']} "
        f"(copy {c['copy_TBps']:.2f} TB/s, bf16 matmul {c['bf16_matmul_TFLOPs']:.0f} TFLOP/s)",
        f"{'T':>6} {'ours µs':>9} {'ours TB/s':>9} {'ours TF/s':>9} {'err ours':>9}"
        + (f" {'vLLM µs':>9} {'speedup':>8} {'vLLM TB/s':>9} {'vLLM TF/s':>9} {'err vLLM':>9}" if with_vllm else ""),
    ]
    for r in result["rows"]:
        line = (
            f"{r['tokens']:>6} {r['ours_us']:>9.1f} {r['ours_TBps']:>9.2f} {r['ours_TFLOPs_dense_equiv']:>9.1f} "
            f"{r['ours_rel_err']:>9.1e}"
        )
        if with_vllm:
            line += (
                f" {r.get('vllm_us', nan):>9.1f} {r.get('speedup', nan):>7.2f}x {r.get('vllm_TBps', nan):>9.2f} "
                f"{r.get('vllm_TFLOPs', nan):>9.1f} {r.get('vllm_rel_err', nan):>9.1e}"
            )
        lines.append(line)
    return "\n".join(lines)
