"""How `convert` chooses the weights to keep: the scores that samoyeds_vllm.format.prune projects onto a pattern.

- magnitude: |W| (prune's default, needs nothing else);
- wanda: |W_ij| * ||X_j|| over calibration activations (below).

Wanda scores a weight by |W_ij| * ||X_j||, the norm taken over the inputs the weight really sees. For an expert
those are the tokens the router sends to it: the MoE block's input for gate/up (w1, w3), and
SiLU(x W1^T) * (x W3^T) of those tokens for down (w2). We run the dense model in transformers on calibration
text, catch each MoE block's input at its `post_attention_layernorm`, route it with the checkpoint's router
(top-k of the logits, the same choice softmax top-k makes), and accumulate the squared inputs per expert.

This loads the whole dense model in float32 on the CPU, so unlike magnitude pruning it needs the model to
fit in memory.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from .architectures import DOWN, GATE, UP, Architecture
from .checkpoint_io import CheckpointReader
from .tokenizer import CORPUS

METHODS = ("magnitude", "wanda")


def wanda_scores(w: torch.Tensor, input_norms: torch.Tensor) -> torch.Tensor:
    """Wanda importance |W_ij| * ||X_j||: weight magnitude scaled by the L2 norm of input channel j over
    calibration activations (`input_norms` [in], or [..., in] batched like `w`)."""
    return w.abs().float() * input_norms.float().unsqueeze(-2)


def _calibration_ids(model_dir: Path, text: str, max_tokens: int) -> torch.Tensor:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:
        raise CheckpointError(
            f"{model_dir}: wanda needs the model's tokenizer to read calibration text ({e})"
        ) from None
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :max_tokens]
    if ids.numel() < 16:
        raise CheckpointError(f"calibration text gives only {ids.numel()} tokens; give more text")
    return ids


def expert_input_norms(
    model_dir: Path, config: dict, arch: Architecture, reader: CheckpointReader, text: str | None, max_tokens: int
) -> dict[tuple[int, str], torch.Tensor]:
    """(layer, "w13" or "w2") -> [experts, in_features] L2 norms of each expert's inputs on `text`."""
    from transformers import AutoModelForCausalLM

    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"wanda calibration assumes SiLU experts, not {config['hidden_act']!r}")
    ids = _calibration_ids(model_dir, text or CORPUS, max_tokens)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    top_k = int(config["num_experts_per_tok"])
    moe_layers = arch.experts_per_layer(reader.names())
    sums: dict[tuple[int, str], torch.Tensor] = {}

    def weight(layer: int, expert: int, role: str) -> torch.Tensor:
        proj = next(p for p, r in arch.projections.items() if r == role)
        return reader.get(arch.expert_weight_name(layer, expert, proj)).float()

    def accumulate(layer: int, num_experts: int, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        router = reader.get(f"model.layers.{layer}.{arch.moe_block}.gate.weight").float()
        chosen = (x @ router.T).topk(top_k, dim=-1).indices
        w13 = sums.setdefault((layer, "w13"), torch.zeros(num_experts, x.shape[-1]))
        w2 = sums.setdefault((layer, "w2"), torch.zeros(num_experts, weight(layer, 0, DOWN).shape[-1]))
        for e in range(num_experts):
            xe = x[(chosen == e).any(-1)]
            if len(xe):
                w13[e] += xe.square().sum(0)
                hidden = torch.nn.functional.silu(xe @ weight(layer, e, GATE).T) * (xe @ weight(layer, e, UP).T)
                w2[e] += hidden.square().sum(0)

    decoder_layers = model.model.layers
    hooks = []
    for layer, num_experts in moe_layers.items():
        norm = getattr(decoder_layers[layer], "post_attention_layernorm", None)
        if norm is None:
            raise CheckpointError(f"wanda calibration cannot find layer {layer}'s post_attention_layernorm")
        hooks.append(
            norm.register_forward_hook(lambda _m, _i, out, layer=layer, n=num_experts: accumulate(layer, n, out))
        )
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return {key: total.sqrt() for key, total in sums.items()}
