"""The peers of `bench moe --peers`: what users run instead of our sparse layer, on the same activations and
routing, each timed and checked the way ours is.

One small function per peer takes the dense problem (tools/moe_problem: the unpruned bf16 weights, x, routing) and
returns a MoEPath: a callable running the layer, the peer's own weights dequantized (so its error is measured
against the fp32 dense product of exactly the weights it computes with, separating quantization error from kernel
error), its bytes per expert, a name. Weights are quantized as checkpoints hold them and prepared for the kernels
by vLLM's own code (the oracle functions vLLM's FP8 MoE method calls when it loads a layer, its GPTQ Marlin repack).

A peer that cannot run on this machine raises PathSkipped with the reason (vLLM's support check, a missing
package); anything else it raises is recorded as a failure. Neither stops the benchmark.

vLLM 0.26.0 functions used (vllm/model_executor/layers/fused_moe/ unless said otherwise):
- fused_moe.py: fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, ..., quant_config=None)
- config.py: FusedMoEConfig, FusedMoEParallelConfig.make_no_parallel(), fp8_w8a8_moe_quant_config(w1_scale,
  w2_scale, ..., block_shape)
- oracle/fp8.py: Fp8MoeBackend, backend_to_kernel_cls, convert_to_fp8_moe_kernel_format, make_fp8_moe_quant_config,
  make_fp8_moe_kernel, select_fp8_moe_backend; modular_kernel.py: FusedMoEKernel.apply
- experts/marlin_moe.py: fused_marlin_moe(hidden_states, w1, w2, bias1, bias2, w1_scale, w2_scale, topk_weights,
  topk_ids, quant_type_id, ...); _custom_ops.gptq_marlin_moe_repack; quantization/utils/quant_utils.py:
  quantize_weights; quantization/utils/marlin_utils.py: marlin_moe_permute_scales
"""

from __future__ import annotations

import gc
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from ..errors import SamoyedsError
from ..format.fp8_blocks import BLOCK as FP8_BLOCK
from ..format.fp8_blocks import dequantize_blocks
from ..tools.fp8_blocks import quantize_blocks
from ..tools.moe_problem import MoEProblem, relative_error
from .quant import (
    dequantize_int4_rows,
    pack_int4_rows,
    tensor_bytes,
)
from .timing import time_cuda_graph_captures

MARLIN_GROUP = 128


class PathSkipped(Exception):
    """The path does not run on this machine; the message says why."""


@dataclass
class MoEPath:
    """One way to compute the layer on one problem."""

    name: str  # id: the JSON key and the --peers name
    label: str  # for the table
    run: Callable[[], torch.Tensor]  # the layer: [T, H] in the activations' dtype
    dequant: Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # expert -> its [2I, H] and [H, I] weights
    bytes_per_expert: int  # weight bytes one expert with tokens reads (values and scales)
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    api: str  # the vLLM entry point it times
    build: Callable[[PeerInputs], MoEPath]
    fp8: bool = False  # starts from the FP8 block-quantized weights


class PeerInputs:
    """The dense problem and what several peers share: int32 routing ids (as vLLM's router returns them), the
    FP8 block-quantized weights (made once, dropped after the last FP8 peer), vLLM's MoE layer config."""

    def __init__(self, problem: MoEProblem):
        self.problem = problem
        self.ids = problem.topk_ids.to(torch.int32)
        self._fp8: tuple[torch.Tensor, ...] | None = None

    @property
    def fp8(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w13 fp8 [E, 2I, H], its scales [E, 2I/128, H/128], w2 fp8 [E, H, I], its scales)."""
        if self._fp8 is None:
            w13, s13 = quantize_blocks(self.problem.w13)
            w2, s2 = quantize_blocks(self.problem.w2)
            self._fp8 = (w13, s13, w2, s2)
        return self._fp8

    def drop_fp8(self) -> None:
        self._fp8 = None

    def moe_config(self):
        return moe_config(self.problem)


def moe_config(p: MoEProblem):
    """vLLM's FusedMoEConfig of the problem's layer: one GPU, no expert parallelism, SiLU, softmax top-k
    renormalised (what the modular kernels and their support checks read)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    e, h, i = p.w13.shape[0], p.w13.shape[2], p.w2.shape[2]
    return FusedMoEConfig(
        num_experts=e,
        experts_per_token=p.topk_ids.shape[1],
        hidden_dim=h,
        intermediate_size=i,
        num_local_experts=e,
        num_logical_experts=e,
        activation=MoEActivation.SILU,
        device=p.x.device,
        routing_method=RoutingMethodType.Renormalize,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        in_dtype=p.x.dtype,
        max_num_tokens=max(p.x.shape[0], 1),
    )


def _tuned_config(p: MoEProblem, dtype: str | None, block_shape: list[int] | None) -> str:
    """The fused-MoE config file vLLM's Triton kernels read for this layer on this GPU, or that none ships."""
    import vllm.model_executor.layers.fused_moe as fused_moe
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name

    name = get_config_file_name(p.w13.shape[0], p.w2.shape[2], dtype, block_shape)
    found = (Path(fused_moe.__file__).parent / "configs" / name).exists()
    return name if found else f"none ({name} is not shipped: vLLM's default config)"


def _ensure_workspace() -> None:
    """vLLM's modular kernels take their buffers from the worker's workspace manager; the engine creates it."""
    from vllm.v1.worker.workspace import init_workspace_manager, is_workspace_manager_initialized

    if not is_workspace_manager_initialized():
        init_workspace_manager(torch.device("cuda"))


# ------------------------------------------------------------------------------------------------- the peers


def bf16_triton(inputs: PeerInputs) -> MoEPath:
    """vLLM's dense bf16 MoE: its Triton `fused_experts` with its tuned config (default config if none ships)."""
    from vllm.model_executor.layers.fused_moe import fused_experts

    p, ids = inputs.problem, inputs.ids
    return MoEPath(
        "bf16-triton",
        PEERS["bf16-triton"].label,
        lambda: fused_experts(p.x, p.w13, p.w2, p.topk_weights, ids),
        lambda e: (p.w13[e], p.w2[e]),
        tensor_bytes(p.w13[0], p.w2[0]),
        {"tuned_config": _tuned_config(p, None, None)},
    )


def fp8_triton_fused_experts(inputs: PeerInputs) -> MoEPath:
    """FP8 block-128 weights, activations quantized per 1 x 128 group, through the functional `fused_experts`."""
    from vllm.model_executor.layers.fused_moe import fused_experts
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

    p, ids = inputs.problem, inputs.ids
    w13, s13, w2, s2 = inputs.fp8
    quant = fp8_w8a8_moe_quant_config(w1_scale=s13, w2_scale=s2, block_shape=list(FP8_BLOCK))
    return MoEPath(
        "fp8-triton-fused_experts",
        PEERS["fp8-triton-fused_experts"].label,
        lambda: fused_experts(p.x, w13, w2, p.topk_weights, ids, quant_config=quant),
        lambda e: (dequantize_blocks(w13[e], s13[e]), dequantize_blocks(w2[e], s2[e])),
        tensor_bytes(w13[0], s13[0], w2[0], s2[0]),
        {"tuned_config": _tuned_config(p, "fp8_w8a8", list(FP8_BLOCK))},
    )


def _fp8_backend(inputs: PeerInputs, name: str, backend_name: str) -> MoEPath:
    """FP8 block-128 weights through one of vLLM's FP8 MoE backends, set up as vLLM's FP8 MoE method sets up a
    layer: the backend's support check, its weight conversion, its quant config, its modular kernel (no DP/EP
    prepare/finalize: activations quantized per 1 x 128 group, dynamically), called as the layer calls it."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.modular_kernel import (
        FusedMoEActivationFormat,
        FusedMoEExpertsMonolithic,
    )
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import (
        Fp8MoeBackend,
        backend_to_kernel_cls,
        convert_to_fp8_moe_kernel_format,
        make_fp8_moe_kernel,
        make_fp8_moe_quant_config,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Dynamic128Sym, kFp8Static128BlockSym

    p, ids, config = inputs.problem, inputs.ids, inputs.moe_config()
    backend = Fp8MoeBackend[backend_name]
    try:
        classes = backend_to_kernel_cls(backend)
    except ImportError as e:
        raise PathSkipped(f"vLLM's {backend_name} experts do not import: {e}") from e
    experts_cls, reasons = None, []
    for cls in classes:
        ok, reason = cls.is_supported_config(
            cls, config, kFp8Static128BlockSym, kFp8Dynamic128Sym, FusedMoEActivationFormat.Standard
        )
        if ok and issubclass(cls, FusedMoEExpertsMonolithic):
            ok, reason = False, "monolithic: it routes itself from router logits, so it cannot take our routing"
        if ok:
            experts_cls = cls
            break
        reasons.append(f"{cls.__name__}: {reason}")
    if experts_cls is None:
        raise PathSkipped("; ".join(reasons) + _skip_note(backend_name, reasons))

    # Every backend but Triton converts the weights (DeepGEMM re-quantizes them in place): convert copies.
    w13, s13, w2, s2 = (t if backend == Fp8MoeBackend.TRITON else t.clone() for t in inputs.fp8)
    e, h, i = p.w13.shape[0], p.w13.shape[2], p.w2.shape[2]
    layer = SimpleNamespace(  # the attributes of vLLM's RoutedExperts layer that the conversions read
        weight_block_size=list(FP8_BLOCK),
        moe_config=config,
        activation=MoEActivation.SILU,
        num_experts=e,
        hidden_size=h,
        intermediate_size_per_partition=i,
        w13_weight=w13,
        orig_dtype=p.x.dtype,
    )
    k13, k2, ks13, ks2 = convert_to_fp8_moe_kernel_format(backend, layer, w13, w2, s13, s2, None, None)
    quant = make_fp8_moe_quant_config(
        backend, w1_scale=ks13, w2_scale=ks2, a1_scale=None, a2_scale=None, block_shape=list(FP8_BLOCK)
    )
    kernel = make_fp8_moe_kernel(quant, config, experts_cls, backend)
    _ensure_workspace()

    def run() -> torch.Tensor:
        return kernel.apply(
            hidden_states=p.x,
            w1=k13,
            w2=k2,
            topk_weights=p.topk_weights,
            topk_ids=ids,
            activation=MoEActivation.SILU,
            global_num_experts=e,
            expert_map=None,
            apply_router_weight_on_input=False,
        )

    # w13, s13, w2, s2 now hold the values the kernel computes with (DeepGEMM's UE8M0 re-quantization included);
    # Marlin (weight-only) multiplies the fp8 values by bf16-rounded scales in the activations' dtype.
    dtype = p.x.dtype if backend == Fp8MoeBackend.MARLIN else torch.float32
    details = {"experts": experts_cls.__name__}
    select = getattr(kernel.fused_experts, "_select_experts_impl", None)
    if select is not None:  # the fallback wrappers (DeepGEMM or CUTLASS, else Triton) pick per call
        try:
            details["runs"] = type(select(p.x, k13, k2)).__name__
        except Exception as e:
            details["runs"] = f"unknown ({type(e).__name__})"
    if backend == Fp8MoeBackend.TRITON:
        details["tuned_config"] = _tuned_config(p, "fp8_w8a8", list(FP8_BLOCK))
    return MoEPath(
        name,
        PEERS[name].label,
        run,
        lambda x: (dequantize_blocks(w13[x], s13[x], dtype=dtype), dequantize_blocks(w2[x], s2[x], dtype=dtype)),
        tensor_bytes(k13[0], k2[0], ks13[0], ks2[0]),
        details,
    )


def _skip_note(backend_name: str, reasons: list[str]) -> str:
    """What vLLM's reason leaves unsaid."""
    if backend_name == "VLLM_CUTLASS" and any("quantization scheme" in r for r in reasons):
        return (
            " (vLLM 0.26's CUTLASS FP8 MoE, CutlassExpertsFp8, takes per-tensor or per-channel scales only: "
            "it has no block-128 grouped GEMM for sm90)"
        )
    if backend_name.startswith("FLASHINFER"):
        from vllm.utils.flashinfer import has_flashinfer

        if not has_flashinfer():
            return " (the flashinfer package is not installed here)"
    return ""


def quantize_int4_gptq(w: torch.Tensor, group_size: int = MARLIN_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert weights [E, out, in] -> GPTQ uint4b8 (symmetric int4, one scale per `group_size` inputs, no act
    order) as a GPTQ checkpoint holds them: qweight int32 [E, in/8, out] and scales [E, in/group, out] in w's dtype.
    Quantized by vLLM's `quantize_weights`, expert by expert."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import quantize_weights
    from vllm.scalar_type import scalar_types

    e, n, k = w.shape
    packed = torch.empty(e, k // 8, n, dtype=torch.int32, device=w.device)
    scales = torch.empty(e, k // group_size, n, dtype=w.dtype, device=w.device)
    for expert in range(e):
        _, q, s, _ = quantize_weights(w[expert].T, scalar_types.uint4b8, group_size)
        packed[expert] = pack_int4_rows(q)
        scales[expert] = s
    return packed, scales


def w4a16_marlin(inputs: PeerInputs) -> MoEPath:
    """GPTQ int4 (group 128) weights, bf16 activations, through vLLM's `fused_marlin_moe`; the weights repacked
    and the scales permuted as vLLM's GPTQ Marlin MoE method does when it loads a layer (no act order)."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_moe_permute_scales
    from vllm.scalar_type import scalar_types

    p, ids = inputs.problem, inputs.ids
    e, h, i = p.w13.shape[0], p.w13.shape[2], p.w2.shape[2]
    q13, s13 = quantize_int4_gptq(p.w13)  # [E, H/8, 2I], [E, H/128, 2I]
    q2, s2 = quantize_int4_gptq(p.w2)  # [E, I/8, H], [E, I/128, H]
    no_act_order = torch.empty(e, 0, dtype=torch.int32, device=p.x.device)
    m13 = ops.gptq_marlin_moe_repack(q13, no_act_order, size_k=h, size_n=2 * i, num_bits=4)
    m2 = ops.gptq_marlin_moe_repack(q2, no_act_order, size_k=i, size_n=h, num_bits=4)
    ms13 = marlin_moe_permute_scales(s13, size_k=h, size_n=2 * i, group_size=MARLIN_GROUP)
    ms2 = marlin_moe_permute_scales(s2, size_k=i, size_n=h, group_size=MARLIN_GROUP)

    def run() -> torch.Tensor:
        return fused_marlin_moe(
            hidden_states=p.x,
            w1=m13,
            w2=m2,
            bias1=None,
            bias2=None,
            w1_scale=ms13,
            w2_scale=ms2,
            topk_weights=p.topk_weights,
            topk_ids=ids,
            quant_type_id=scalar_types.uint4b8.id,
            global_num_experts=e,
            g_idx1=no_act_order,
            g_idx2=no_act_order,
            sort_indices1=no_act_order,
            sort_indices2=no_act_order,
            is_k_full=True,
        )

    return MoEPath(
        "w4a16-marlin",
        PEERS["w4a16-marlin"].label,
        run,
        lambda x: (
            dequantize_int4_rows(q13[x], s13[x], MARLIN_GROUP).T,
            dequantize_int4_rows(q2[x], s2[x], MARLIN_GROUP).T,
        ),
        tensor_bytes(m13[0], m2[0], ms13[0], ms2[0]),
    )


def _backend(name: str, backend: str) -> Callable[[PeerInputs], MoEPath]:
    return lambda inputs: _fp8_backend(inputs, name, backend)


_FP8_MK = "FusedMoEKernel(MoEPrepareAndFinalizeNoDPEPModular, {}).apply (oracle/fp8.py make_fp8_moe_kernel)"

PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in [
        Peer("bf16-triton", "vLLM bf16 Triton", "fused_moe.fused_experts", bf16_triton),
        Peer(
            "fp8-triton",
            "vLLM FP8 Triton",
            _FP8_MK.format("TritonExperts"),
            _backend("fp8-triton", "TRITON"),
            fp8=True,
        ),
        Peer(
            "fp8-triton-fused_experts",
            "vLLM FP8 fused_experts",
            "fused_moe.fused_experts(quant_config=fp8_w8a8_moe_quant_config(block_shape=[128, 128]))",
            fp8_triton_fused_experts,
            fp8=True,
        ),
        Peer(
            "fp8-deepgemm",
            "vLLM FP8 DeepGEMM",
            _FP8_MK.format("TritonOrDeepGemmExperts"),
            _backend("fp8-deepgemm", "DEEPGEMM"),
            fp8=True,
        ),
        Peer(
            "fp8-cutlass",
            "vLLM FP8 CUTLASS",
            _FP8_MK.format("TritonOrCutlassExperts"),
            _backend("fp8-cutlass", "VLLM_CUTLASS"),
            fp8=True,
        ),
        Peer(
            "fp8-flashinfer-cutlass",
            "FlashInfer FP8 CUTLASS",
            _FP8_MK.format("FlashInferExperts"),
            _backend("fp8-flashinfer-cutlass", "FLASHINFER_CUTLASS"),
            fp8=True,
        ),
        Peer(
            "fp8-marlin",
            "vLLM FP8 Marlin W8A16",
            _FP8_MK.format("MarlinExperts"),
            _backend("fp8-marlin", "MARLIN"),
            fp8=True,
        ),
        Peer("w4a16-marlin", "vLLM Marlin W4A16 g128", "experts.marlin_moe.fused_marlin_moe", w4a16_marlin),
    ]
}
LEGACY_PEER = "bf16-triton"  # the vLLM columns of the first table and the JSON's vllm_* keys


def parse_peers(text: str | None) -> list[str]:
    """--peers: "all" or names separated by commas -> the peers to run, in table order, bf16-triton first."""
    if text is None:
        return [LEGACY_PEER]
    names = list(PEERS) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    if unknown := [n for n in names if n not in PEERS]:
        raise SamoyedsError(f"unknown peer {', '.join(unknown)}; choose 'all' or some of {', '.join(PEERS)}")
    return [n for n in PEERS if n == LEGACY_PEER or n in names]


# --------------------------------------------------------------------------------------------- measuring


def measure(path: MoEPath, p: MoEProblem, ref_bf16: torch.Tensor | None = None) -> tuple[dict, torch.Tensor]:
    """One path on one problem: its output, its error against the fp32 dense product of its own (dequantized)
    weights and against `ref_bf16`, then its time in CUDA graphs as bench/timing.py takes it. Returns the record
    and the output (for errors measured later)."""
    from ..plugin.ops import moe_reference

    out = path.run()
    torch.cuda.synchronize()
    record = {"rel_err_own": relative_error(out, moe_reference(p.x, p.topk_weights, p.topk_ids, path.dequant))}
    if ref_bf16 is not None:
        record["rel_err_bf16_dense"] = relative_error(out, ref_bf16)
    record["first_capture_us"], record["us"] = time_cuda_graph_captures(path.run)
    seconds = record["us"] * 1e-6
    used = p.topk_ids.unique().numel()
    moved = used * path.bytes_per_expert + 2 * p.x.numel() * p.x.element_size()
    t, k = p.topk_ids.shape
    flops = 2 * t * k * 3 * p.w13.shape[2] * p.w2.shape[2]
    record.update(
        TBps=moved / seconds / 1e12,
        TFLOPs_dense_equiv=flops / seconds / 1e12,
        bytes_per_expert=path.bytes_per_expert,
        **path.details,
    )
    return record, out


def run_peers(problem: MoEProblem, names: list[str], ref_bf16: torch.Tensor) -> list[dict]:
    """Each named peer built, checked and timed on the dense problem; a record per peer with its status ("ok",
    "skipped" or "failed") and, unless ok, the reason. GPU memory is handed back after each."""
    inputs = PeerInputs(problem)
    last_fp8 = max((n for n, name in enumerate(names) if PEERS[name].fp8), default=-1)
    records = []
    for n, name in enumerate(names):
        peer = PEERS[name]
        record = {"name": name, "label": peer.label, "kind": "peer"}
        try:
            path = peer.build(inputs)
            measured, _ = measure(path, problem, ref_bf16)
            record.update(status="ok", **measured)
        except PathSkipped as e:
            record.update(status="skipped", reason=str(e))
        except torch.cuda.OutOfMemoryError as e:
            record.update(status="failed", reason=f"out of GPU memory: {_first_line(e)}")
        except Exception as e:  # a peer's failure is a result, not the end of the benchmark
            traceback.print_exc(file=sys.stderr)
            record.update(status="failed", reason=f"{type(e).__name__}: {_first_line(e)}")
        path = None
        if n == last_fp8:
            inputs.drop_fp8()
        gc.collect()
        torch.cuda.empty_cache()
        records.append(record)
    return records


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:limit]


def vllm_environment(problem: MoEProblem) -> dict:
    """What decides vLLM's FP8 MoE here: DeepGEMM's availability and scale format, and the backend vLLM's oracle
    would pick for a block-FP8 layer of this shape (what `vllm serve` of an FP8 checkpoint runs)."""
    env: dict = {}
    try:
        from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used, is_deep_gemm_supported

        env["deep_gemm_supported"] = bool(is_deep_gemm_supported())
        env["deep_gemm_e8m0"] = bool(is_deep_gemm_e8m0_used())
    except Exception as e:
        env["deep_gemm"] = f"unknown ({type(e).__name__}: {_first_line(e)})"
    try:
        from vllm.model_executor.layers.fused_moe.oracle.fp8 import select_fp8_moe_backend
        from vllm.model_executor.layers.quantization.utils.quant_utils import (
            kFp8Dynamic128Sym,
            kFp8Static128BlockSym,
        )

        backend, cls = select_fp8_moe_backend(moe_config(problem), kFp8Static128BlockSym, kFp8Dynamic128Sym)
        env["fp8_block_default_backend"] = f"{backend.value} ({cls.__name__ if cls else None})"
    except Exception as e:
        env["fp8_block_default_backend"] = f"unknown ({type(e).__name__}: {_first_line(e)})"
    return env


# ----------------------------------------------------------------------------------------------- the table


def speedups(paths: list[dict]) -> tuple[str | None, dict[str, dict[str, float]]]:
    """(the fastest peer that ran, {ours name: {peer name: peer µs / ours µs, ..., "best": ...}})."""
    ok = [r for r in paths if r.get("status") == "ok"]
    peers = [r for r in ok if r["kind"] == "peer"]
    best = min(peers, key=lambda r: r["us"], default=None)
    table = {}
    for ours in (r for r in ok if r["kind"] == "ours"):
        row = {peer["name"]: peer["us"] / ours["us"] for peer in peers}
        if best is not None:
            row["best"] = best["us"] / ours["us"]
        table[ours["name"]] = row
    return (best["name"] if best else None), table


def format_paths_table(result: dict) -> str:
    """Every path of every token count, then the best peer per token count and ours against it. Without peers
    (`--no-vllm`), ours' variants with their error against ours with unquantized values instead."""
    rows = [r for r in result["rows"] if r.get("paths")]
    if not rows:
        return ""
    peers_ran = any(r["kind"] == "peer" for row in rows for r in row["paths"])
    ours = [r["name"] for r in rows[0]["paths"] if r["kind"] == "ours"] if peers_ran else []
    width = max(len(r["label"]) for row in rows for r in row["paths"])

    def ratios(row: dict, peer: str) -> str:  # one column per ours variant
        return "".join(" " + _cell(_ratio(row.get("speedups", {}).get(name, {}).get(peer)), name) for name in ours)

    header = "".join(" " + _cell("x " + name, name) for name in ours)
    second_err = "rel_err_bf16_dense" if peers_ran else "rel_err_unquantized"
    if peers_ran:
        lines = [
            "Every path on the same x and routing. µs: CUDA-graph replay (bench/timing.py); x NAME: the path's µs /",
            "NAME's µs; err own: against the fp32 product of the path's own dequantized weights; err bf16: against",
            "that of the bf16 dense weights (ours: pruned from them).",
        ]
    else:
        lines = [
            "Ours only. µs: CUDA-graph replay (bench/timing.py); err own: against the fp32 product of the path's own",
            "dequantized weights; err unq: against ours with unquantized values.",
        ]
    lines.append(
        f"{'T':>6}  {'path':<{width}} {'µs':>9}{header} {'err own':>9} {'err bf16' if peers_ran else 'err unq':>9} "
        f"{'TB/s':>6} {'TF/s':>7}"
    )
    for row in rows:
        for r in row["paths"]:
            head = f"{row['tokens']:>6}  {r['label']:<{width}}"
            if r.get("status") != "ok":
                lines.append(f"{head} {r.get('status', '?')}: {r.get('reason', '')}")
                continue
            second = f"{r[second_err]:>9.1e}" if second_err in r else f"{'-':>9}"
            lines.append(
                f"{head} {r['us']:>9.1f}{ratios(row, r['name'])} {r['rel_err_own']:>9.1e} {second} "
                f"{r['TBps']:>6.2f} {r['TFLOPs_dense_equiv']:>7.1f}"
            )
    if not peers_ran:
        return "\n".join(lines)
    lines += ["", f"{'T':>6}  {'best peer':<{width}} {'µs':>9}{header}"]
    for row in rows:
        best = next((r for r in row["paths"] if r["name"] == row.get("best_peer")), None)
        if best is None:
            lines.append(f"{row['tokens']:>6}  (no peer ran)")
        else:
            lines.append(f"{row['tokens']:>6}  {best['label']:<{width}} {best['us']:>9.1f}{ratios(row, 'best')}")
    return "\n".join(lines)


def _cell(text: str, name: str) -> str:
    return f"{text:>{max(9, len(name) + 2)}}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
