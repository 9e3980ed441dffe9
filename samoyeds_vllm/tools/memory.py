"""What a model takes of a GPU in each form it can be served in, from its config.json alone: the bytes of its weights
per GPU (dense bf16, dense FP8 with 128 x 128 block scales, 2:4 or samoyeds experts with bf16 or FP8 values), and
what is left for vLLM's KV cache. It answers "does it fit, and how many sequences" before anything is downloaded.

The tensors are those of the hub checkpoint (model_maker.weight_specs), the packed ones those of the format
(Pattern.packed_shapes), so the count follows the code that writes them. Under tensor parallelism vLLM splits
every projection, the experts and the vocabulary across the GPUs and keeps a whole copy of the norms, the routers,
MLA's low-rank input projections and, with fewer key/value heads than GPUs, one head on each. The KV cache of MLA
(DeepSeek) is its compressed latent, whole on every GPU.

What vLLM keeps beside weights and KV cache (the activations of its profiling run, CUDA graphs, the CUDA context)
is not in config.json: `overhead` stands for it, measured at 3.4-4.0 GiB on the Qwen3-30B-A3B shape (vLLM 0.26, H100,
its default 8192 batched tokens) and 3.6 GiB on Qwen3-235B-A22B on one H200; under tensor parallelism each GPU also
keeps the communicators' buffers (5.1 GiB per GPU in all, Qwen3-235B-A22B over two H200s). docs/benchmarks.md
compares these estimates with engine logs.

The packed forms count a converted checkpoint (`samoyeds-vllm convert`). Sparsifying on load (`--quantization
samoyeds` on a dense checkpoint) first loads the dense experts, so the dense form's weights must fit too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import PatternError, SamoyedsError
from ..format import Pattern
from ..format.fp8_blocks import BLOCK, quantized_bytes
from .architectures import ALIASES, ARCHITECTURES, moe_shape, text_config
from .model_maker import FORMS, FP8_WEIGHT, ModelForm, weight_specs

GIB = 2**30
#: Memory of one GPU as the driver reports it (nvidia-smi's total, which vLLM's --gpu-memory-utilization scales).
GPU_BYTES = {"h100": 81559 * 2**20, "h200": 143771 * 2**20}
#: What vLLM keeps per GPU beside weights and KV cache, on one GPU and under tensor parallelism (the module's text
#: gives the measurements).
DEFAULT_OVERHEAD_GIB = 4.0
TENSOR_PARALLEL_OVERHEAD_GIB = 5.0

#: Tensors every GPU holds whole under tensor parallelism (besides 1-D ones): routers, MLA's low-rank inputs.
_REPLICATED = re.compile(r".*\.(gate|router|shared_expert_gate|q_a_proj|kv_a_proj_with_mqa)\.weight$")
_KV_PROJ = re.compile(r".*\.(k_proj|v_proj)\.weight$")


def _expert_matrices(arch, name: str, shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """The [out, in] routed-expert matrices a checkpoint tensor holds, or None if it holds none."""
    if arch.expert_weight_re.match(name):
        return [shape]
    if arch.fused_expert_re and (m := arch.fused_expert_re.match(name)):  # [E, in, roles * out]
        experts, inputs, outputs = shape
        roles = len(arch.fused_roles(m["fused"]))
        return [(outputs // roles, inputs)] * (experts * roles)
    return None


def _fp8_blocks(form: ModelForm, from_fp8: bool) -> bool:
    """Whether the checkpoint has FP8 128 x 128-block layers: a dense FP8 form's, or the other layers of a packed one
    converted from an FP8 checkpoint (as the caller's `from_fp8` or the form's own says)."""
    return form.fp8_projections or (from_fp8 and not form.dense)


def tensor_parallel_refusal(
    hf_config: dict, form: ModelForm, tp: int, from_fp8: bool = False, segment: int | None = None
):
    """Why vLLM or the method would refuse this form at tensor parallel size `tp` (None: they would not): heads
    that do not divide, expert shards that cut segments, or FP8 scale blocks."""
    c = text_config(hf_config)
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    if heads % tp:
        return f"{heads} attention heads do not divide among {tp} GPUs"
    if kv_heads % tp and tp % kv_heads:
        return f"{kv_heads} key/value heads and {tp} GPUs: neither divides the other"
    inter = moe_shape(hf_config).intermediate
    if inter % tp:
        return f"the expert intermediate size {inter} does not divide among {tp} GPUs"
    shard = inter // tp
    if (pattern := form.parsed_pattern(segment)) is not None:
        try:
            pattern.check_shape((moe_shape(hf_config).hidden, shard), "down projection shard")
        except PatternError as e:
            return f"{e} (at TP = {tp})" if tp > 1 else str(e)
    if tp > 1 and any(shard % b for b in BLOCK) and _fp8_blocks(form, from_fp8):
        return f"{shard}-wide expert shards at TP = {tp} cut the FP8 checkpoint's {BLOCK[0]} x {BLOCK[1]} scale blocks"
    return None


def weight_bytes(
    hf_config: dict, form: ModelForm, tp: int = 1, from_fp8: bool = False, segment: int | None = None
) -> int:
    """Bytes of the weights on each of `tp` GPUs once loaded. `from_fp8`: the model was converted from an FP8
    block-quantized checkpoint, whose other projections the sparse checkpoint keeps in FP8 (as a form's own
    `from_fp8` says)."""
    arch = ARCHITECTURES[ALIASES.get(hf_config["model_type"], hf_config["model_type"])]
    pattern = form.parsed_pattern(segment)
    kv_heads = text_config(hf_config).get("num_key_value_heads")
    other_fp8 = _fp8_blocks(form, from_fp8)
    total = 0.0
    for name, shape in weight_specs(hf_config):
        if (experts := _expert_matrices(arch, name, shape)) is not None:
            if pattern is None:
                size = sum(quantized_bytes((m, k)) if form.fp8 else 2 * m * k for m, k in experts)
            else:
                size = sum(pattern.packed_bytes((m, k), 1 if form.fp8 else 2, scaled=form.fp8) for m, k in experts)
        elif other_fp8 and len(shape) == 2 and FP8_WEIGHT.match(name):
            size = quantized_bytes(shape)
        else:
            size = 2 * math.prod(shape)
        if len(shape) == 1 or _REPLICATED.match(name):
            share = 1.0
        elif _KV_PROJ.match(name) and kv_heads:
            share = max(1 / tp, 1 / kv_heads)  # fewer key/value heads than GPUs: one on each
        else:
            share = 1 / tp
        total += size * share
    return round(total)


def kv_bytes_per_token(hf_config: dict, tp: int = 1, dtype_bytes: int = 2) -> int:
    """KV-cache bytes of one token on each GPU (vLLM's default cache dtype: the model's, bf16 here)."""
    c = text_config(hf_config)
    layers = c["num_hidden_layers"]
    if c.get("kv_lora_rank"):  # MLA: the compressed latent and the rotary key, the same on every GPU
        return layers * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * dtype_bytes
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    heads = max(1, c.get("num_key_value_heads", c["num_attention_heads"]) // tp)
    return layers * 2 * heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class Fit:
    name: str  # of the form, in FORMS
    weights_gib: float | None  # per GPU; None: the form is refused for this model and layout (`reason`)
    kv_gib: float | None  # per GPU; negative: the weights and the overhead alone do not fit
    kv_tokens: int = 0
    sequences: float = 0.0  # of seq_len tokens at once
    reason: str | None = None
    seq_len: int = 0

    @property
    def form(self) -> ModelForm:
        return FORMS[self.name]

    @property
    def fits(self) -> bool:
        """vLLM starts only with room in the KV cache for one sequence of its maximum length."""
        return self.kv_tokens >= max(self.seq_len, 1)


def default_overhead_gib(tp: int) -> float:
    """The overhead estimate for `tp` GPUs."""
    return TENSOR_PARALLEL_OVERHEAD_GIB if tp > 1 else DEFAULT_OVERHEAD_GIB


def plan(
    hf_config: dict,
    forms: list[str],
    gpu_bytes: int,
    tp: int = 1,
    utilization: float = 0.9,
    overhead_gib: float | None = None,
    seq_len: int = 4096,
    from_fp8: bool = False,
    segment: int | None = None,
) -> list[Fit]:
    """Each form's weights and the KV cache vLLM would have beside them on each of `tp` GPUs of `gpu_bytes`, with
    `overhead_gib` per GPU kept for the rest (default_overhead_gib when None)."""
    if not 0 < utilization <= 1:
        raise SamoyedsError(f"gpu memory utilization must be in (0, 1], not {utilization}")
    if tp < 1:
        raise SamoyedsError(f"tensor parallel size must be at least 1, not {tp}")
    if unknown := [f for f in forms if f not in FORMS]:
        raise SamoyedsError(f"unknown form {', '.join(unknown)}; choose from {', '.join(FORMS)}")
    if not (math.isfinite(gpu_bytes) and gpu_bytes > 0):
        raise SamoyedsError(f"GPU memory must be a positive number of bytes, not {gpu_bytes}")
    if overhead_gib is None:
        overhead_gib = default_overhead_gib(tp)
    if not (math.isfinite(overhead_gib) and overhead_gib >= 0):
        raise SamoyedsError(f"the overhead must be zero or more GiB, not {overhead_gib}")
    if seq_len < 1:
        raise SamoyedsError(f"the sequence length must be at least 1, not {seq_len}")
    context = text_config(hf_config).get("max_position_embeddings")
    if isinstance(context, int) and seq_len > context:
        raise SamoyedsError(
            f"the sequence length {seq_len} is past the model's context of {context} tokens "
            "(max_position_embeddings): vLLM refuses such a --max-model-len"
        )
    if segment is not None:
        Pattern.parse("samoyeds", segment)  # a bad segment is the caller's error, not the model's
    per_token = kv_bytes_per_token(hf_config, tp)
    fits = []
    for name in forms:
        form = FORMS[name]
        try:
            refusal = tensor_parallel_refusal(hf_config, form, tp, from_fp8, segment)
            weights = None if refusal else weight_bytes(hf_config, form, tp, from_fp8, segment)
        except PatternError as e:
            refusal = str(e)
        if refusal:
            fits.append(Fit(name, None, None, reason=refusal, seq_len=seq_len))
            continue
        kv = utilization * gpu_bytes - weights - overhead_gib * GIB
        tokens = max(0, int(kv // per_token))
        fits.append(Fit(name, weights / GIB, kv / GIB, tokens, tokens / seq_len, seq_len=seq_len))
    return fits
