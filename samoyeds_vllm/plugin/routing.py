"""Router logits -> (weights, expert ids) for the experts the method runs.

Every routing comes from vLLM's own router (`create_fused_moe_router`, given the layer's routing attributes as
vLLM's `FusedMoE` gives them to the layer's own router): on CUDA the method calls it, so the experts get what
vLLM's fused MoE would, fused routing kernels included, and routings vLLM adds later come for free. Its CUDA ops
are missing from the CPU build, so there each router class is computed with plain tensor ops that follow vLLM's
code path for path (vLLM's own CPU grouped top-k for grouped routing, the custom routing function itself). Plain
softmax top-k on CUDA calls vLLM's fused top-k softmax kernel directly, as vLLM's `FusedTopKRouter` does, without
the router's Python layers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

#: The scoring functions the CPU path computes (vLLM's router also has DeepSeek-V4's hash routing, not here).
SCORING_FUNCS = ("softmax", "sigmoid")


@dataclass(eq=False)
class Routing:
    """A layer's routing, as vLLM's `RoutedExperts` records it. `routed_scaling_factor` is the one vLLM gives the
    router: 1.0 where the model asks vLLM's MoE runner to scale the experts' output instead (DeepSeek-V2/V3,
    GLM-4.5 off ROCm), so applying it here never applies it twice."""

    top_k: int
    renormalize: bool = True
    scoring_func: str = "softmax"
    use_grouped_topk: bool = False
    num_expert_group: int | None = None
    topk_group: int | None = None
    e_score_correction_bias: torch.Tensor | None = None
    routed_scaling_factor: float = 1.0
    custom_routing_function: Callable | None = None
    global_num_experts: int = 0

    @classmethod
    def of_layer(cls, layer) -> Routing:
        """The fields are named as the layer's attributes and as create_fused_moe_router's arguments. Its router
        and plain_softmax are computed here, at load: the method reads plain_softmax where torch.compile traces
        (vLLM's CPU backend in compiled mode), and dynamo cannot take the lock of a cached_property's first read."""
        routing = cls(**{f.name: getattr(layer, f.name) for f in fields(cls)})
        _ = routing.plain_softmax
        return routing

    @functools.cached_property
    def router(self):
        """vLLM's router for this routing (building it runs no ops: fine on CPU)."""
        from vllm.model_executor.layers.fused_moe.router.router_factory import create_fused_moe_router

        return create_fused_moe_router(**{f.name: getattr(self, f.name) for f in fields(self)})

    @functools.cached_property
    def plain_softmax(self) -> bool:
        """vLLM's router is a `FusedTopKRouter` with softmax: one `topk_softmax` kernel on CUDA."""
        from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter

        return type(self.router) is FusedTopKRouter and self.scoring_func == "softmax"

    def unsupported_on_cpu(self) -> str | None:
        """What the CPU path cannot compute (None: everything), named for the load-time error."""
        from vllm.model_executor.layers.fused_moe.router.custom_routing_router import CustomRoutingRouter

        if self.scoring_func not in SCORING_FUNCS and not isinstance(self.router, CustomRoutingRouter):
            return f"scoring function {self.scoring_func!r}"
        if type(self.router).__name__ not in _CPU_ROUTERS:
            return f"vLLM's {type(self.router).__name__}"
        return None


def route(
    router_logits: torch.Tensor, routing: Routing, hidden_states: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 weights [T, k] and expert ids [T, k] (int64 from the fused and CPU paths, vLLM's router's int32 on
    CUDA otherwise; the op takes either). `hidden_states` goes to custom routing functions (default: the logits,
    for callers without them: only its token count is read elsewhere)."""
    if hidden_states is None:
        hidden_states = router_logits
    if router_logits.is_cuda:
        if routing.plain_softmax and _fused_topk_softmax() is not None:
            return _route_fused(router_logits, routing.top_k, routing.renormalize)
        # Softmax grouped top-k without a bias (DeepSeek-V2) keeps the tensor ops it ran on the GPU before this
        # module called vLLM's router (GPU-tested); vLLM's router serves the routings added with it.
        if type(routing.router).__name__ == "GroupedTopKRouter" and routing.e_score_correction_bias is None:
            return _route_cpu(routing, hidden_states, router_logits)
        return routing.router.select_experts(hidden_states, router_logits)
    return _route_cpu(routing, hidden_states, router_logits)


def _route_cpu(routing: Routing, hidden_states: torch.Tensor, logits: torch.Tensor):
    """vLLM's router, class by class, in tensor ops."""
    router = routing.router
    kind = type(router).__name__
    if kind == "CustomRoutingRouter":  # the model's function (Llama-4's: top-k of logits, sigmoid of those)
        weights, ids = router.select_experts(hidden_states, logits)
        return weights, ids.long()
    bias, scale = routing.e_score_correction_bias, routing.routed_scaling_factor
    if kind == "GroupedTopKRouter":
        experts, groups = logits.shape[-1], routing.num_expert_group
        if experts > groups and experts % groups == 0:
            from vllm.model_executor.layers.fused_moe.cpu_fused_moe import grouped_topk

            weights, ids = grouped_topk(
                hidden_states,
                logits,
                routing.top_k,
                routing.renormalize,
                groups,
                routing.topk_group,
                routing.scoring_func,
                scale,
                bias,
            )
            return weights.float(), ids.long()
        # vLLM's GroupedTopKRouter without valid groups: fused_topk_bias, or fused_topk (softmax, unscaled)
        if bias is None:
            return _topk(logits, "softmax", None, routing.top_k, routing.renormalize, 1.0)
        return _topk(logits, routing.scoring_func, bias, routing.top_k, routing.renormalize, scale)
    if kind == "FusedTopKBiasRouter":
        return _topk(logits, routing.scoring_func, bias, routing.top_k, routing.renormalize, scale)
    if kind == "FusedTopKRouter":  # vLLM's fused_topk applies no routed_scaling_factor
        return _topk(logits, routing.scoring_func, None, routing.top_k, routing.renormalize, 1.0)
    raise NotImplementedError(f"the samoyeds method cannot compute vLLM's {kind} on CPU")


_CPU_ROUTERS = ("CustomRoutingRouter", "GroupedTopKRouter", "FusedTopKBiasRouter", "FusedTopKRouter")


def _topk(logits, scoring_func, bias, top_k, renormalize, scale):
    """vLLM's topk_softmax / topk_sigmoid kernels (and fused_topk_bias's tensor-op version): scores in fp32, the
    bias added for selection only, weights from the unbiased scores, renormalised, then scaled."""
    logits = logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring_func == "softmax" else logits.sigmoid()
    choice = scores if bias is None else scores + bias.unsqueeze(0)
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if scale != 1.0:
        weights = weights * scale
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


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's softmax top-k (FusedTopKRouter): its fused CUDA kernel where there is one, else the same in tensor
    ops."""
    if router_logits.is_cuda and _fused_topk_softmax() is not None:
        return _route_fused(router_logits, top_k, renormalize)
    return softmax_topk_ops(router_logits, top_k, renormalize)


def softmax_topk_ops(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax_topk in tensor ops alone, which import nothing of vLLM: the routing of made-up problems
    (tools/moe_problem.py), where importing vLLM for its fused kernel cost every bench process on an H200 ~15 s."""
    return _topk(router_logits, "softmax", None, top_k, renormalize, 1.0)


def _route_fused(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = router_logits.shape[0]
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=router_logits.device)
    token_expert = torch.empty(tokens, top_k, dtype=torch.int32, device=router_logits.device)
    _fused_topk_softmax()(weights, ids, token_expert, router_logits, renormalize)
    return weights, ids
