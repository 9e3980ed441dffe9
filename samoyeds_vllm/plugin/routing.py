"""Router logits -> (weights, expert ids) for the experts the method runs.

vLLM's fused top-k softmax kernel on CUDA (the kernel its own MoE routes with), plain tensor ops elsewhere and
for grouped top-k (traceable by torch.compile, no host syncs).
"""

from __future__ import annotations

import functools

import torch


def route(
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    """vLLM's CUDA top-k softmax, or None without vLLM's CUDA ops. One launch instead of the ~6 of the plain ops,
    which took ~18 µs per layer of an H100 decode step (Qwen3-30B-A3B, vLLM's torch profiler) against ~4 µs."""
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
