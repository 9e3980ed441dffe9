"""`samoyeds::moe_experts`: the routed experts as a torch custom op, so vLLM's torch.compile and CUDA graphs treat
them as opaque; `samoyeds::moe_experts_softmax_topk` the same routed by vLLM's softmax top-k of the router's logits
inside the op, where the one-token kernels take the top-k themselves (a launch fewer at batch-1 decode).

The op is registered on a torch.library.Library directly (schema, one kernel per dispatch key, a fake), as vLLM
registers its own ops: torch.library.custom_op's Python dispatch costs several times more per call (10 against
2.6 µs on CPU), and steps that run without CUDA graphs pay it in every MoE layer.

It returns sum_k weight_k * W2_e(SiLU(W1_e x) * (W3_e x)) per token from the packed weights of
samoyeds_vllm.format. The body below is the reference implementation (CPU and any device): it unpacks the weights
of each expert that received tokens. On CUDA the kernels of samoyeds_vllm.kernels run instead, for the dtypes and
shapes they support. The pattern crosses the op boundary as its two fields (`Pattern.name`, `Pattern.segment`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .. import kernels
from ..format import PackedWeight, Pattern, decompress
from .routing import softmax_topk


@functools.cache
def _pattern(name: str, segment: int | None) -> Pattern:
    return Pattern.parse(name, segment)


def moe_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: PackedWeight,
    w2: PackedWeight,
    pattern: Pattern,
) -> torch.Tensor:
    """The op on packed weights: x [T, H], routing [T, k] (ids of experts on other ranks are -1), w13 the gate rows
    then the up rows of every expert, w2 the down projections."""
    return torch.ops.samoyeds.moe_experts(x, topk_weights, topk_ids, *w13, *w2, pattern.name, pattern.segment)


def moe_experts_softmax_topk(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    w13: PackedWeight,
    w2: PackedWeight,
    pattern: Pattern,
) -> torch.Tensor:
    """moe_experts routed by vLLM's softmax top-k (FusedTopKRouter's) of router_logits [T, E], every expert on this
    GPU."""
    return torch.ops.samoyeds.moe_experts_softmax_topk(
        x, router_logits, top_k, renormalize, *w13, *w2, pattern.name, pattern.segment
    )


def _moe_experts_reference(
    x: torch.Tensor,  # [T, H] activations
    topk_weights: torch.Tensor,  # [T, k] routing weights
    topk_ids: torch.Tensor,  # [T, k] local expert ids; -1 for experts not on this rank
    w13_values: torch.Tensor,  # [E, rows(2I), H/2]   gate rows then up rows, packed
    w13_meta: torch.Tensor,  # [E, rows(2I), H/16]
    w13_rowsel: torch.Tensor | None,  # [E, I, H/V] samoyeds only
    w13_scale: torch.Tensor | None,  # [E, 2I] FP8 values only: fp32 scale of each output row
    w2_values: torch.Tensor,  # [E, rows(H), I/2]
    w2_meta: torch.Tensor,  # [E, rows(H), I/16]
    w2_rowsel: torch.Tensor | None,  # [E, H/2, I/V] samoyeds only
    w2_scale: torch.Tensor | None,  # [E, H] FP8 values only
    pattern: str,  # Pattern.name
    segment: int | None,  # Pattern.segment
) -> torch.Tensor:
    # the format's layout, or the kernels' (weights prepared for them, e.g. by tools.moe_problem, on a CPU tensor)
    w13 = kernels.checkpoint_layout(PackedWeight(w13_values, w13_meta, w13_rowsel, w13_scale))
    w2 = kernels.checkpoint_layout(PackedWeight(w2_values, w2_meta, w2_rowsel, w2_scale))
    return _unpacked_reference(x, topk_weights, topk_ids, w13, w2, _pattern(pattern, segment))


def _unpacked_reference(x, topk_weights, topk_ids, w13: PackedWeight, w2: PackedWeight, pattern: Pattern):
    """The reference implementation: moe_reference on each expert's unpacked weights."""

    def expert_weights(expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        w13_e, w2_e = (PackedWeight(*(t if t is None else t[expert] for t in w)) for w in (w13, w2))
        return decompress(w13_e, pattern), decompress(w2_e, pattern)

    return moe_reference(x, topk_weights, topk_ids, expert_weights).to(x.dtype)


def moe_reference(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_weights: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The MoE layer in fp32, expert by expert (host-synchronising, simple): expert_weights(e) gives expert e's
    dense [2I, H] gate/up and [H, I] down weights. Returns fp32 [T, H]."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_weights = topk_weights.reshape(-1).float()
    for expert in flat_ids[flat_ids >= 0].unique().tolist():
        slots = (flat_ids == expert).nonzero().squeeze(1)
        tokens = token_of[slots]
        w13, w2 = expert_weights(expert)
        gate, up = (x[tokens].float() @ w13.float().T).chunk(2, dim=-1)
        expert_out = (F.silu(gate) * up) @ w2.float().T
        out.index_add_(0, tokens, expert_out * flat_weights[slots, None])
    return out


def _experts_fake(x, *_):  # either op's schema arguments; the output is x's shape and dtype
    return torch.empty_like(x)


def _moe_experts_cuda(
    x,
    topk_weights,
    topk_ids,
    w13_values,
    w13_meta,
    w13_rowsel,
    w13_scale,
    w2_values,
    w2_meta,
    w2_rowsel,
    w2_scale,
    pattern,
    segment,
):
    w13 = PackedWeight(w13_values, w13_meta, w13_rowsel, w13_scale)
    w2 = PackedWeight(w2_values, w2_meta, w2_rowsel, w2_scale)
    pattern_ = _pattern(pattern, segment)
    if kernels.supports(x.dtype, w13, w2) and not os.environ.get("SAMOYEDS_FORCE_REFERENCE"):
        return kernels.moe_experts(x, topk_weights, topk_ids, w13, w2, pattern_)
    # float32, shapes off the kernels' tiles, or asked for (debugging): the checkpoint's layout again
    w13, w2 = kernels.checkpoint_layout(w13), kernels.checkpoint_layout(w2)
    return _unpacked_reference(x, topk_weights, topk_ids, w13, w2, pattern_)


def _moe_experts_softmax_topk_reference(
    x: torch.Tensor,
    router_logits: torch.Tensor,  # [T, E]
    top_k: int,
    renormalize: bool,
    w13_values: torch.Tensor,
    w13_meta: torch.Tensor,
    w13_rowsel: torch.Tensor | None,
    w13_scale: torch.Tensor | None,
    w2_values: torch.Tensor,
    w2_meta: torch.Tensor,
    w2_rowsel: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    pattern: str,
    segment: int | None,
) -> torch.Tensor:
    weights, ids = softmax_topk(router_logits, top_k, renormalize)
    packed = (w13_values, w13_meta, w13_rowsel, w13_scale, w2_values, w2_meta, w2_rowsel, w2_scale)
    return _moe_experts_reference(x, weights, ids, *packed, pattern, segment)


def _moe_experts_softmax_topk_cuda(x, router_logits, top_k, renormalize, *packed_and_pattern):
    *packed, pattern, segment = packed_and_pattern  # w13's four tensors, w2's four, the pattern's two fields
    w13, w2 = PackedWeight(*packed[:4]), PackedWeight(*packed[4:])
    pattern_ = _pattern(pattern, segment)
    if (
        kernels.supports(x.dtype, w13, w2)
        and not os.environ.get("SAMOYEDS_FORCE_REFERENCE")
        and kernels.routes_logits(x, router_logits, top_k, w13, pattern_)
    ):
        return kernels.moe_experts_from_logits(x, router_logits, top_k, renormalize, w13, w2, pattern_)
    weights, ids = softmax_topk(router_logits, top_k, renormalize)
    return _moe_experts_cuda(x, weights, ids, *w13, *w2, pattern, segment)


_LIBRARY = torch.library.Library("samoyeds", "FRAGMENT")  # the op lives as long as this object
_LIBRARY.define("moe_experts" + torch.library.infer_schema(_moe_experts_reference, mutates_args=()))
_LIBRARY.impl("moe_experts", _moe_experts_reference, "CompositeExplicitAutograd")  # CPU and any other device
_LIBRARY.impl("moe_experts", _moe_experts_cuda, "CUDA")
torch.library.register_fake("samoyeds::moe_experts", _experts_fake, lib=_LIBRARY)
_LIBRARY.define(
    "moe_experts_softmax_topk" + torch.library.infer_schema(_moe_experts_softmax_topk_reference, mutates_args=())
)
_LIBRARY.impl("moe_experts_softmax_topk", _moe_experts_softmax_topk_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("moe_experts_softmax_topk", _moe_experts_softmax_topk_cuda, "CUDA")
torch.library.register_fake("samoyeds::moe_experts_softmax_topk", _experts_fake, lib=_LIBRARY)
