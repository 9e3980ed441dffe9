"""What this project knows about each supported MoE model family, in one table.

Checkpoints are in the Hugging Face hub layout, which is what vLLM and transformers both load: one tensor per
expert and projection, except Llama-4, whose hub checkpoints hold each layer's experts as two 3-D tensors (its
vLLM loader takes either). For each family we record how its routed-expert weights are named, so the converter
knows what to sparsify; how the router picks experts is vLLM's (plugin/routing.py reads it off the layer).

Multimodal checkpoints (Llama-4's Llama4ForConditionalGeneration) hold the language model under a name prefix
(`language_model.model.layers...`) and its config under `text_config`, beside a vision tower and a projector,
which stay dense: only the language model's routed experts are sparse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from ..errors import CheckpointError
from ..format import EXPERT_COUNT_KEYS

#: Roles of the three expert projections, named as vLLM names its fused-MoE shards.
GATE, UP, DOWN = "w1", "w3", "w2"


@dataclass(frozen=True)
class Architecture:
    model_type: str  # config.json "model_type"
    hf_class: str  # config.json "architectures"[0]
    moe_block: str  # module path of the MoE block inside a decoder layer ("mlp", "block_sparse_moe")
    projections: dict[str, str]  # checkpoint projection name -> role (w1 gate, w3 up, w2 down)
    #: Hub checkpoints that store each MoE layer's experts fused, inputs before outputs: names (inside
    #: `experts`) of [E, hidden, 2 * inter] gate and up side by side, and of [E, inter, hidden] down (Llama-4).
    #: The tools read them as the per-expert tensors `projections` names, which sparse checkpoints hold.
    fused_experts: tuple[str, str] | None = None
    #: The router's weights scale each expert's input instead of its output (Llama-4, top-1 only in vLLM), so
    #: transformers' experts module takes the scaled inputs of every expert.
    weights_on_input: bool = False
    #: What the language model's tensor names start with: "" in text checkpoints, "language_model." in
    #: multimodal ones (vLLM names its layers so too: `language_model.model.layers.L.feed_forward.experts`).
    text_prefix: str = ""

    @property
    def layers_prefix(self) -> str:
        """The decoder layers' tensor names start with this, then the layer index."""
        return f"{self.text_prefix}model.layers."

    def _layer_re(self, rest: str) -> re.Pattern[str]:
        """`<layers_prefix>L.<moe_block>.experts.<rest>`, capturing L as `layer`."""
        return re.compile(
            rf"^{re.escape(self.layers_prefix)}(?P<layer>\d+)\.{re.escape(self.moe_block)}\.experts\.{rest}$"
        )

    @property
    def expert_weight_re(self) -> re.Pattern[str]:
        """Matches `<layers_prefix>L.<moe_block>.experts.E.<proj>.weight`, capturing L, E and proj."""
        projs = "|".join(map(re.escape, self.projections))
        return self._layer_re(rf"(?P<expert>\d+)\.(?P<proj>{projs})\.weight")

    @property
    def fused_expert_re(self) -> re.Pattern[str] | None:
        """Matches `<layers_prefix>L.<moe_block>.experts.<fused>` of a fused-experts checkpoint, capturing L and
        fused (None: experts are stored one tensor per expert)."""
        if self.fused_experts is None:
            return None
        return self._layer_re(rf"(?P<fused>{'|'.join(map(re.escape, self.fused_experts))})")

    def fused_roles(self, fused: str) -> tuple[str, ...]:
        """The roles a fused tensor holds, in order along its last axis: (GATE, UP) or (DOWN,)."""
        return (GATE, UP) if fused == self.fused_experts[0] else (DOWN,)

    def split_fused(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """A fused tensor as per-expert [out, in] weights, by per-expert name."""
        m = self.fused_expert_re.match(name)
        layer, roles = int(m["layer"]), self.fused_roles(m["fused"])
        parts = tensor.transpose(-1, -2).chunk(len(roles), dim=-2)
        return {
            self.expert_weight_name(layer, expert, self.projection(role)): part[expert]
            for expert in range(tensor.shape[0])
            for role, part in zip(roles, parts, strict=True)
        }

    def fuse(self, name: str, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        """The fused tensor `name` from its per-expert [out, in] weights (the inverse of split_fused)."""
        m = self.fused_expert_re.match(name)
        layer, roles = int(m["layer"]), self.fused_roles(m["fused"])
        experts = len(weights) // len(roles)
        per_role = [
            torch.stack([weights[self.expert_weight_name(layer, e, self.projection(r))] for e in range(experts)])
            for r in roles
        ]
        return torch.cat(per_role, dim=-2).transpose(-1, -2).contiguous()

    def projection(self, role: str) -> str:
        """The checkpoint's projection name for a role (GATE, UP or DOWN)."""
        return next(proj for proj, r in self.projections.items() if r == role)

    def expert_weight_name(self, layer: int, expert: int, proj: str) -> str:
        return f"{self.layers_prefix}{layer}.{self.moe_block}.experts.{expert}.{proj}.weight"

    def sparse_module_globs(self) -> list[str]:
        """The sparse modules, as globs over checkpoint tensor names (recorded in quantization_config)."""
        return [f"{self.layers_prefix}*.{self.moe_block}.experts.*.{p}" for p in self.projections]

    def experts_per_layer(self, tensor_names) -> dict[int, int]:
        """MoE layer index -> number of experts, read off a checkpoint's tensor names."""
        experts: dict[int, set[int]] = {}
        for name in tensor_names:
            if m := self.expert_weight_re.match(name):
                experts.setdefault(int(m["layer"]), set()).add(int(m["expert"]))
        return {layer: max(found) + 1 for layer, found in sorted(experts.items())}


_QWEN_PROJ = {"gate_proj": GATE, "up_proj": UP, "down_proj": DOWN}
_LLAMA4_TEXT = Architecture(
    "llama4_text",
    "Llama4ForCausalLM",
    "feed_forward",
    _QWEN_PROJ,
    fused_experts=("gate_up_proj", "down_proj"),
    weights_on_input=True,
)

ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in [
        Architecture("mixtral", "MixtralForCausalLM", "block_sparse_moe", {"w1": GATE, "w3": UP, "w2": DOWN}),
        Architecture("qwen2_moe", "Qwen2MoeForCausalLM", "mlp", _QWEN_PROJ),
        Architecture("qwen3_moe", "Qwen3MoeForCausalLM", "mlp", _QWEN_PROJ),
        Architecture("olmoe", "OlmoeForCausalLM", "mlp", _QWEN_PROJ),
        Architecture("glm4_moe", "Glm4MoeForCausalLM", "mlp", _QWEN_PROJ),
        _LLAMA4_TEXT,
        # The hub's Llama-4 checkpoints: the text model above under language_model., a vision tower and projector.
        replace(
            _LLAMA4_TEXT, model_type="llama4", hf_class="Llama4ForConditionalGeneration", text_prefix="language_model."
        ),
        # Leading dense layers and shared experts (`mlp.shared_experts`) are not routed experts: they stay dense.
        Architecture("deepseek_v2", "DeepseekV2ForCausalLM", "mlp", _QWEN_PROJ),
        Architecture("deepseek_v3", "DeepseekV3ForCausalLM", "mlp", _QWEN_PROJ),
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


def text_config(hf_config: dict) -> dict:
    """The language model's part of a config.json dict: its `text_config` in a multimodal config, else itself."""
    return hf_config.get("text_config") or hf_config


def moe_shape(hf_config: dict) -> MoEShape:
    """MoEShape of a config.json dict (the families name these fields differently)."""
    c = text_config(hf_config)
    experts = next((c[k] for k in EXPERT_COUNT_KEYS if c.get(k)), None)
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
