"""The sparse-MoE operations, as torch custom ops so vLLM's torch.compile and CUDA graphs treat them as opaque.

`route` turns router logits into (weights, expert ids): vLLM's fused top-k softmax kernel on CUDA, plain tensor
ops elsewhere and for grouped top-k (traceable, no host syncs).
`samoyeds::moe_experts` runs the routed experts from the packed weights of formats.py and returns
sum_k weight_k * W2_e(SiLU(W1_e x) * (W3_e x)) per token. Its reference implementation below (CPU and any
device) unpacks the weights of each expert that received tokens; the GPU kernels register against the same op.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from .formats import Pattern, PackedWeight, decompress


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool, num_expert_group: int | None = None,
          topk_group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing, optionally restricted to the best `topk_group` of `num_expert_group` expert
    groups (DeepSeek-V2's grouped top-k). Returns fp32 weights [T, k] and int64 expert ids [T, k]."""
    grouped = bool(num_expert_group and num_expert_group > 1)
    if router_logits.is_cuda and not grouped and _fused_topk_softmax() is not None:
        return _route_fused(router_logits, top_k, renormalize)
    scores = torch.softmax(router_logits.float(), dim=-1)
    if grouped:
        tokens, experts = scores.shape
        group_scores = scores.view(tokens, num_expert_group, -1).amax(dim=-1)
        best_groups = group_scores.topk(topk_group, dim=-1).indices
        group_mask = torch.zeros_like(group_scores).scatter_(1, best_groups, 1.0)
        expert_mask = group_mask.unsqueeze(-1).expand(tokens, num_expert_group, experts // num_expert_group)
        scores = scores.masked_fill(expert_mask.reshape(tokens, experts) == 0, 0.0)
    weights, ids = scores.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


@functools.cache
def _fused_topk_softmax():
    """vLLM's CUDA top-k softmax (the kernel its own MoE routes with), or None without vLLM's CUDA ops. One launch
    instead of the ~6 of the plain ops, which took ~18 µs per layer of an H100 decode step (Qwen3-30B-A3B,
    benchmarks/results/h100-2026-11-22-decode) against ~4 µs."""
    try:
        from vllm import _custom_ops
    except ImportError:
        return None
    return _custom_ops.topk_softmax if hasattr(torch.ops._moe_C, "topk_softmax") else None


def _route_fused(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = router_logits.shape[0]
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=router_logits.device)
    token_expert = torch.empty(tokens, top_k, dtype=torch.int32, device=router_logits.device)
    _fused_topk_softmax()(weights, ids, token_expert, router_logits, renormalize)
    return weights, ids


def _pattern(segment: int) -> Pattern:
    """The op's integer encoding of the pattern: segment 0 means 2:4, otherwise samoyeds with that V."""
    return Pattern.parse("2:4") if segment == 0 else Pattern.parse("samoyeds", segment)


@torch.library.custom_op("samoyeds::moe_experts", mutates_args=())
def moe_experts(
    x: torch.Tensor,  # [T, H] activations
    topk_weights: torch.Tensor,  # [T, k] routing weights
    topk_ids: torch.Tensor,  # [T, k] local expert ids; -1 for experts not on this rank
    w13_values: torch.Tensor,  # [E, rows(2I), H/2]   gate rows then up rows, packed (formats.py)
    w13_meta: torch.Tensor,  # [E, rows(2I), H/16]
    w13_rowsel: torch.Tensor | None,  # [E, I, H/V] samoyeds only
    w2_values: torch.Tensor,  # [E, rows(H), I/2]
    w2_meta: torch.Tensor,  # [E, rows(H), I/16]
    w2_rowsel: torch.Tensor | None,  # [E, H/2, I/V] samoyeds only
    segment: int,  # 0 for 2:4, else the samoyeds segment V
) -> torch.Tensor:
    """sum_k topk_weights * expert(x), from packed expert weights. This body is the reference implementation
    (any device); on CUDA the kernels registered below run instead."""
    return moe_experts_reference(x, topk_weights, topk_ids, w13_values, w13_meta, w13_rowsel, w2_values, w2_meta,
                                 w2_rowsel, segment)


def moe_experts_reference(x, topk_weights, topk_ids, w13_values, w13_meta, w13_rowsel, w2_values, w2_meta,
                          w2_rowsel, segment: int) -> torch.Tensor:
    """Per expert with tokens, unpack its weights and run its MLP in fp32 (host-synchronising, simple)."""
    pattern = _pattern(segment)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_weights = topk_weights.reshape(-1).float()
    for expert in flat_ids[flat_ids >= 0].unique().tolist():
        slots = (flat_ids == expert).nonzero().squeeze(1)
        tokens = token_of[slots]
        w13 = decompress(PackedWeight(w13_values[expert], w13_meta[expert],
                                      None if w13_rowsel is None else w13_rowsel[expert]), pattern).float()
        w2 = decompress(PackedWeight(w2_values[expert], w2_meta[expert],
                                     None if w2_rowsel is None else w2_rowsel[expert]), pattern).float()
        gate_up = x[tokens].float() @ w13.T
        gate, up = gate_up.chunk(2, dim=-1)
        expert_out = (F.silu(gate) * up) @ w2.T
        out.index_add_(0, tokens, expert_out * flat_weights[slots, None])
    return out.to(x.dtype)


@moe_experts.register_fake
def _(x, topk_weights, topk_ids, w13_values, w13_meta, w13_rowsel, w2_values, w2_meta, w2_rowsel, segment):
    return torch.empty_like(x)


@moe_experts.register_kernel("cuda")
def _(x, topk_weights, topk_ids, w13_values, w13_meta, w13_rowsel, w2_values, w2_meta, w2_rowsel, segment):
    from . import kernels

    args = (x, topk_weights, topk_ids, w13_values, w13_meta, w13_rowsel, w2_values, w2_meta, w2_rowsel, segment)
    if kernels.supports(x.dtype, w13_values, w2_values) and not os.environ.get("SAMOYEDS_FORCE_REFERENCE"):
        return kernels.moe_experts_cuda(*args)
    return moe_experts_reference(*args)  # float32, shapes off the kernels' tiles, or asked for (debugging)
