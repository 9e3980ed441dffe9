"""What this project knows about each supported MoE model family, in one table.

Checkpoints are in the Hugging Face hub layout (one tensor per expert and projection), which is what vLLM and
transformers both load. For each family we record how its routed-expert weights are named, so the converter
knows what to sparsify, and how the router picks experts, so the vLLM method can route on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import CheckpointError

#: Roles of the three expert projections, named as vLLM names its fused-MoE shards.
GATE, UP, DOWN = "w1", "w3", "w2"


@dataclass(frozen=True)
class Architecture:
    model_type: str  # config.json "model_type"
    hf_class: str  # config.json "architectures"[0]
    moe_block: str  # module path of the MoE block inside a decoder layer ("mlp", "block_sparse_moe")
    projections: dict[str, str]  # checkpoint projection name -> role (w1 gate, w3 up, w2 down)
    #: How the router turns logits into expert weights: "softmax" top-k, then renormalised over the top-k if
    #: the config key named by `renormalize_key` is true (or always when that key is None and `renormalize`).
    renormalize_key: str | None = None
    renormalize: bool = False

    @property
    def expert_weight_re(self) -> re.Pattern[str]:
        """Matches `model.layers.L.<moe_block>.experts.E.<proj>.weight`, capturing L, E and proj."""
        projs = "|".join(map(re.escape, self.projections))
        return re.compile(
            rf"^model\.layers\.(?P<layer>\d+)\.{re.escape(self.moe_block)}\.experts\.(?P<expert>\d+)\."
            rf"(?P<proj>{projs})\.weight$"
        )

    def projection(self, role: str) -> str:
        """The checkpoint's projection name for a role (GATE, UP or DOWN)."""
        return next(proj for proj, r in self.projections.items() if r == role)

    def expert_weight_name(self, layer: int, expert: int, proj: str) -> str:
        return f"model.layers.{layer}.{self.moe_block}.experts.{expert}.{proj}.weight"

    def sparse_module_globs(self) -> list[str]:
        """The sparse modules, as globs over checkpoint tensor names (recorded in quantization_config)."""
        return [f"model.layers.*.{self.moe_block}.experts.*.{p}" for p in self.projections]

    def experts_per_layer(self, tensor_names) -> dict[int, int]:
        """MoE layer index -> number of experts, read off a checkpoint's tensor names."""
        experts: dict[int, set[int]] = {}
        for name in tensor_names:
            if m := self.expert_weight_re.match(name):
                experts.setdefault(int(m["layer"]), set()).add(int(m["expert"]))
        return {layer: max(found) + 1 for layer, found in sorted(experts.items())}

    def renormalizes(self, hf_config: dict) -> bool:
        if self.renormalize_key is None:
            return self.renormalize
        return bool(hf_config.get(self.renormalize_key, False))


_QWEN_PROJ = {"gate_proj": GATE, "up_proj": UP, "down_proj": DOWN}

ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in [
        Architecture(
            "mixtral", "MixtralForCausalLM", "block_sparse_moe", {"w1": GATE, "w3": UP, "w2": DOWN}, renormalize=True
        ),
        Architecture("qwen2_moe", "Qwen2MoeForCausalLM", "mlp", _QWEN_PROJ, renormalize_key="norm_topk_prob"),
        Architecture("qwen3_moe", "Qwen3MoeForCausalLM", "mlp", _QWEN_PROJ, renormalize_key="norm_topk_prob"),
        Architecture("olmoe", "OlmoeForCausalLM", "mlp", _QWEN_PROJ, renormalize_key="norm_topk_prob"),
        # Leading dense layers and shared experts (`mlp.shared_experts`) are not routed experts: they stay dense.
        Architecture("deepseek_v2", "DeepseekV2ForCausalLM", "mlp", _QWEN_PROJ, renormalize_key="norm_topk_prob"),
        Architecture("deepseek_v3", "DeepseekV3ForCausalLM", "mlp", _QWEN_PROJ, renormalize_key="norm_topk_prob"),
    ]
}

#: model_types whose checkpoints are another family's: Kimi-K2's config.json says "kimi_k2" with the
#: DeepseekV3ForCausalLM architecture and tensors (vLLM reads it as DeepSeek-V3; transformers has no kimi_k2).
ALIASES = {"kimi_k2": "deepseek_v3"}


@dataclass(frozen=True)
class MoEShape:
    """The routed-expert shape of a model: what the expert kernels and benchmarks need."""

    num_experts: int
    hidden: int
    intermediate: int
    top_k: int


def moe_shape(hf_config: dict) -> MoEShape:
    """MoEShape of a config.json dict (the families name these fields differently)."""
    c = hf_config
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    inter = c.get("moe_intermediate_size") or c.get("intermediate_size")
    if not experts or not inter or "num_experts_per_tok" not in c:
        raise CheckpointError(f"config of model_type {c.get('model_type')!r} describes no routed experts")
    return MoEShape(int(experts), int(c["hidden_size"]), int(inter), int(c["num_experts_per_tok"]))


class UnsupportedArchitectureError(CheckpointError):
    pass


def architecture_of(hf_config: dict) -> Architecture:
    """The Architecture of a config.json dict, or a clear error listing what is supported."""
    model_type = hf_config.get("model_type")
    model_type = ALIASES.get(model_type, model_type)
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not a supported MoE architecture; supported: "
            f"{', '.join(sorted([*ARCHITECTURES, *ALIASES]))}"
        )
    return ARCHITECTURES[model_type]
