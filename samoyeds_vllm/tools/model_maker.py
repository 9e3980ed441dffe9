"""Make Hugging Face MoE checkpoints with random weights, for tests and benchmarks without hub downloads.

A preset (configs/models/*.json) is a real config.json. The weights are written as the hub has them, one tensor per
expert and projection (Llama-4: its two fused tensors per layer; multimodal Llama-4: the language model under
`language_model.`, beside a vision tower and projector), because that is the layout vLLM, transformers and our
converter read. Names and shapes come from a small per-family table rather than from instantiating transformers
models: transformers 5 fuses experts internally, and real presets are far too large to instantiate.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import SamoyedsError
from ..format import Pattern, quantization_config
from ..format.fp8_blocks import SCALE_SUFFIX, block_size, quantized_bytes
from .architectures import ALIASES, ARCHITECTURES, DOWN, Architecture, architecture_of, text_config
from .checkpoint_io import (
    DEFAULT_MAX_SHARD_BYTES,
    DTYPES,
    ShardedWriter,
    check_free_space,
    check_output_dir,
    staged_dirs,
)
from .fp8_blocks import fp8_block_config, quantize_blocks
from .presets import load_preset, preset_family
from .tokenizer import build_tokenizer

TensorSpec = tuple[str, tuple[int, ...]]


def _qwen_moe_layer(c: dict, layer: int) -> bool:
    """Qwen-MoE: `mlp_only_layers` and every `decoder_sparse_step`-th layer otherwise."""
    return (
        layer not in c.get("mlp_only_layers", [])
        and c["num_experts"] > 0
        and (layer + 1) % c.get("decoder_sparse_step", 1) == 0
    )


@dataclass(frozen=True)
class _Layout:
    """What differs between the families' checkpoints, beyond what architectures.Architecture records."""

    num_experts_key: str  # config key: routed experts per layer
    expert_size_key: str  # config key: routed expert intermediate size
    attention: str = "mha"  # "mha": q/k/v/o_proj; "mla": DeepSeek's multi-head latent attention
    #: "qkv": q/k/v always have biases; "config": q/k/v/o if attention_bias; "config_qkv": q/k/v if attention_bias
    attention_bias: str | None = None
    qk_norm: str | None = None  # "per_head": q_norm/k_norm over head_dim; "all_heads": over heads * head_dim
    qk_norm_key: str | None = None  # config key switching qk_norm on (None: always on where qk_norm is set)
    #: The dense shared expert(s) beside the routed ones: module name inside the MoE block and intermediate size
    #: (0: none).
    shared_expert: str | None = None
    shared_expert_size: Callable[[dict], int] | None = None
    shared_expert_gate: bool = False  # mlp.shared_expert_gate: a sigmoid gate on the shared expert's output
    router_bias: bool = False  # gate.e_score_correction_bias: added to the scores to select experts (DeepSeek-V3 style)
    #: Which layers are MoE layers (None: all); the others are dense MLPs of `dense_size_key`, at the MoE block's
    #: module path.
    moe_layer: Callable[[dict, int], bool] | None = None
    dense_size_key: str = "intermediate_size"
    router: str = "gate"  # the router's module name inside the MoE block


_DEEPSEEK = _Layout(
    "n_routed_experts",
    "moe_intermediate_size",
    attention="mla",
    shared_expert="shared_experts",
    shared_expert_size=lambda c: c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0),
    # as vLLM's and DeepSeek's own modeling code decide
    moe_layer=lambda c, layer: layer >= c.get("first_k_dense_replace", 0) and layer % c.get("moe_layer_freq", 1) == 0,
)
_LAYOUTS = {
    "mixtral": _Layout("num_local_experts", "intermediate_size"),
    "qwen2_moe": _Layout(
        "num_experts",
        "moe_intermediate_size",
        attention_bias="qkv",
        shared_expert="shared_expert",
        shared_expert_size=lambda c: c["shared_expert_intermediate_size"],
        shared_expert_gate=True,
        moe_layer=_qwen_moe_layer,
    ),
    "qwen3_moe": _Layout(
        "num_experts",
        "moe_intermediate_size",
        attention_bias="config",
        qk_norm="per_head",
        moe_layer=_qwen_moe_layer,
    ),
    "olmoe": _Layout("num_experts", "intermediate_size", attention_bias="config", qk_norm="all_heads"),
    "glm4_moe": _Layout(
        "n_routed_experts",
        "moe_intermediate_size",
        attention_bias="config_qkv",
        qk_norm="per_head",
        qk_norm_key="use_qk_norm",
        shared_expert="shared_experts",
        shared_expert_size=lambda c: c["moe_intermediate_size"] * c["n_shared_experts"],
        router_bias=True,
        moe_layer=lambda c, layer: layer >= c["first_k_dense_replace"],
    ),
    # Llama-4's q/k norms have no weights; vLLM's Llama-4 has no attention biases, so attention_bias is not used.
    "llama4_text": _Layout(
        "num_local_experts",
        "intermediate_size",
        shared_expert="shared_expert",
        shared_expert_size=lambda c: c["intermediate_size"],
        moe_layer=lambda c, layer: (layer + 1) % c["interleave_moe_layer_step"] == 0,
        dense_size_key="intermediate_size_mlp",
        router="router",
    ),
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": replace(_DEEPSEEK, router_bias=True),
}


def _llama4_vision(c: dict) -> list[TensorSpec]:
    """Llama-4's vision tower and multimodal projector (transformers' Llama4VisionModel and
    Llama4MultiModalProjector), which stay dense: a ViT with biases and LayerNorms, its pixel-shuffle adapter, and the
    projection into the language model's embeddings."""
    v = c["vision_config"]
    hidden, inter = v["hidden_size"], v["intermediate_size"]
    p = "vision_model"

    def layer_norm(name: str) -> list[TensorSpec]:
        return [(f"{name}.weight", (hidden,)), (f"{name}.bias", (hidden,))]

    def linear(name: str, out: int, inputs: int) -> list[TensorSpec]:
        return [(f"{name}.weight", (out, inputs)), (f"{name}.bias", (out,))]

    specs: list[TensorSpec] = [
        (f"{p}.patch_embedding.linear.weight", (hidden, v["num_channels"] * v["patch_size"] ** 2)),
        (f"{p}.class_embedding", (hidden,)),
        (f"{p}.positional_embedding_vlm", ((v["image_size"] // v["patch_size"]) ** 2 + 1, hidden)),  # + class
        *layer_norm(f"{p}.layernorm_pre"),
        *layer_norm(f"{p}.layernorm_post"),
    ]
    for layer in range(v["num_hidden_layers"]):
        block = f"{p}.model.layers.{layer}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            specs += linear(f"{block}.self_attn.{proj}", hidden, hidden)
        specs += linear(f"{block}.mlp.fc1", inter, hidden) + linear(f"{block}.mlp.fc2", hidden, inter)
        specs += layer_norm(f"{block}.input_layernorm") + layer_norm(f"{block}.post_attention_layernorm")
    out = v["projector_output_dim"]
    return specs + [
        (f"{p}.vision_adapter.mlp.fc1.weight", (v["projector_input_dim"], inter)),
        (f"{p}.vision_adapter.mlp.fc2.weight", (out, out)),
        ("multi_modal_projector.linear_1.weight", (text_config(c)["hidden_size"], v["vision_output_dim"])),
    ]


#: Multimodal families: their vision side's tensors; the language model's are its text_config's family's, under
#: Architecture.text_prefix.
_VISION_TOWERS = {"llama4": _llama4_vision}


def _attention_shapes(layout: _Layout, c: dict) -> dict[str, tuple[int, ...]]:
    """The attention's weights, norms included (module name inside self_attn -> shape of its `weight`)."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    if layout.attention == "mha":
        kv_heads = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or hidden // heads
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        shapes = {"q_proj": (q_size, hidden), "k_proj": (kv_size, hidden), "v_proj": (kv_size, hidden)}
        shapes["o_proj"] = (hidden, q_size)
        qk_norm = layout.qk_norm if layout.qk_norm_key is None or c.get(layout.qk_norm_key) else None
        if norms := {"per_head": (head_dim, head_dim), "all_heads": (q_size, kv_size)}.get(qk_norm):
            shapes |= {"q_norm": norms[:1], "k_norm": norms[1:]}
        return shapes
    # MLA: queries straight from the hidden state (q_lora_rank null, DeepSeek-V2-Lite) or through a low-rank
    # bottleneck; keys and values through the kv_lora_rank latent, plus one rope key shared by all heads.
    if c.get("attention_bias"):
        raise SamoyedsError(f"{c['model_type']}: attention_bias is not supported (vLLM's MLA layers have no biases)")
    nope, rope, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_lora, kv_lora = c.get("q_lora_rank"), c["kv_lora_rank"]
    if q_lora is None:
        query = {"q_proj": (heads * (nope + rope), hidden)}
    else:
        query = {"q_a_proj": (q_lora, hidden), "q_a_layernorm": (q_lora,), "q_b_proj": (heads * (nope + rope), q_lora)}
    return query | {
        "kv_a_proj_with_mqa": (kv_lora + rope, hidden),
        "kv_a_layernorm": (kv_lora,),
        "kv_b_proj": (heads * (nope + v_dim), kv_lora),
        "o_proj": (hidden, heads * v_dim),
    }


def weight_specs(hf_config: dict) -> list[TensorSpec]:
    """Every tensor of a hub checkpoint of this config, as (name, shape), layer by layer."""
    model_type = hf_config["model_type"]
    if model_type in _VISION_TOWERS:
        prefix = ARCHITECTURES[model_type].text_prefix
        text = [(prefix + name, shape) for name, shape in weight_specs(text_config(hf_config))]
        return text + _VISION_TOWERS[model_type](hf_config)  # text first: one seed, the text model's weights
    if model_type not in _LAYOUTS:
        raise SamoyedsError(
            f"cannot make weights for model_type {model_type!r}; supported: {', '.join(_weight_families())} "
            "(other families: config only)"
        )
    arch, layout, c = ARCHITECTURES[model_type], _LAYOUTS[model_type], hf_config
    if layout.router_bias and c.get("topk_method", "noaux_tc") != "noaux_tc":
        # transformers always has the bias, vLLM only with noaux_tc: no checkpoint would load in both
        raise SamoyedsError(f"{model_type}: topk_method {c.get('topk_method')!r} is not supported, only noaux_tc")
    hidden = c["hidden_size"]
    num_experts, expert_size = c[layout.num_experts_key], c[layout.expert_size_key]
    attention = _attention_shapes(layout, c)

    biases = {
        "qkv": ["q_proj", "k_proj", "v_proj"],
        "config": ["q_proj", "k_proj", "v_proj", "o_proj"] if c.get("attention_bias") else [],
        "config_qkv": ["q_proj", "k_proj", "v_proj"] if c.get("attention_bias") else [],
    }
    bias_projs = biases.get(layout.attention_bias, [])

    def mlp(prefix: str, size: int) -> list[TensorSpec]:
        return [
            (f"{prefix}.gate_proj.weight", (size, hidden)),
            (f"{prefix}.up_proj.weight", (size, hidden)),
            (f"{prefix}.down_proj.weight", (hidden, size)),
        ]

    specs: list[TensorSpec] = [("model.embed_tokens.weight", (c["vocab_size"], hidden))]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        block = f"{p}.{arch.moe_block}"
        specs += [(f"{p}.input_layernorm.weight", (hidden,)), (f"{p}.post_attention_layernorm.weight", (hidden,))]
        specs += [(f"{p}.self_attn.{module}.weight", shape) for module, shape in attention.items()]
        specs += [(f"{p}.self_attn.{proj}.bias", attention[proj][:1]) for proj in bias_projs]
        if layout.moe_layer is not None and not layout.moe_layer(c, layer):
            specs += mlp(block, c[layout.dense_size_key])
            continue
        specs.append((f"{block}.{layout.router}.weight", (num_experts, hidden)))
        if layout.router_bias:
            specs.append((f"{block}.{layout.router}.e_score_correction_bias", (num_experts,)))
        if arch.fused_experts:  # [E, in, out], gate and up side by side
            gate_up, down = arch.fused_experts
            specs += [
                (f"{block}.experts.{gate_up}", (num_experts, hidden, 2 * expert_size)),
                (f"{block}.experts.{down}", (num_experts, expert_size, hidden)),
            ]
        else:
            for expert in range(num_experts):
                specs += [
                    (
                        arch.expert_weight_name(layer, expert, proj),
                        (hidden, expert_size) if role == DOWN else (expert_size, hidden),
                    )
                    for proj, role in arch.projections.items()
                ]
        if layout.shared_expert and (shared_size := layout.shared_expert_size(c)):
            specs += mlp(f"{block}.{layout.shared_expert}", shared_size)
        if layout.shared_expert_gate:
            specs.append((f"{block}.shared_expert_gate.weight", (1, hidden)))
    specs.append(("model.norm.weight", (hidden,)))
    if not c.get("tie_word_embeddings", False):
        specs.append(("lm_head.weight", (c["vocab_size"], hidden)))
    return specs


def _weight_families() -> list[str]:
    """The model_types make-model writes random weights for."""
    return [*_LAYOUTS, *_VISION_TOWERS]


def _fan_in(arch: Architecture, name: str, shape: tuple[int, ...]) -> int:
    """The inputs of a weight: its last axis, [out, in], except fused experts' [E, in, out]."""
    return shape[-2] if arch.fused_experts and arch.fused_expert_re.match(name) else shape[-1]


#: Norm weights: RMSNorms' and LayerNorms' (`input_layernorm.weight`, a ViT's `layernorm_pre.weight`).
_NORM_WEIGHT = re.compile(r"norm[^.]*\.weight$")


def _random_tensor(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, fan_in: int
) -> torch.Tensor:
    """Norm weights 1 and biases 0, as trained models start; matrices with std 1/sqrt(fan_in), so every layer
    changes the residual stream as much as a trained one (with the usual std 0.02 the embeddings dominate and
    the experts barely affect the output, which would make token comparisons blind to expert bugs).

    Drawn in float32 (3x faster on CPU than drawing bfloat16), so one seed gives the same weights in every dtype.
    """
    if _NORM_WEIGHT.search(name):
        return torch.ones(shape, dtype=dtype)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype)
    std = fan_in**-0.5
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator).to(dtype)


#: The weights an FP8 block-quantized checkpoint stores in FP8: attention, expert and MLP projections (Qwen3-FP8
#: and DeepSeek-V3 keep embeddings, norms, routers and the LM head in bf16).
FP8_WEIGHT = re.compile(r".*(_proj|\.w[123])\.weight$")


def _not_fp8_modules(hf_config: dict) -> list[str]:
    """modules_to_not_convert of an FP8 block config: the linear layers that stay unquantized (routers, LM head)."""
    names = [name.removesuffix(".weight") for name, shape in weight_specs(hf_config) if len(shape) == 2]
    return [n for n in names if not FP8_WEIGHT.match(n + ".weight") and not n.endswith("embed_tokens")]


def weights_bytes(hf_config: dict) -> int:
    """Bytes of the weights write_weights writes for `hf_config`: in its dtype, projections in FP8 with their block
    scales where its quantization_config says so."""
    size = DTYPES[hf_config["torch_dtype"]].itemsize
    block = block_size(hf_config.get("quantization_config"))
    total = 0
    for name, shape in weight_specs(hf_config):
        if block and FP8_WEIGHT.match(name):
            total += quantized_bytes(shape, block)
        else:
            total += size * math.prod(shape)
    return total


def write_weights(
    model_dir: Path, hf_config: dict, seed: int = 0, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
) -> None:
    """Write random weights for `hf_config` (in its torch_dtype) into `model_dir`, one shard in memory at a time;
    an FP8 block quantization_config quantizes the projections (weight and weight_scale_inv)."""
    if max_shard_bytes <= 0:
        raise SamoyedsError(f"max_shard_bytes must be positive, not {max_shard_bytes}")
    specs = weight_specs(hf_config)
    dtype = DTYPES[hf_config["torch_dtype"]]
    total_bytes = sum(math.prod(shape) for _, shape in specs) * torch.empty((), dtype=dtype).element_size()
    writer = ShardedWriter(model_dir, max_shard_bytes)
    generator = torch.Generator().manual_seed(seed)
    block = block_size(hf_config.get("quantization_config"))
    arch = ARCHITECTURES[hf_config["model_type"]]
    with tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="random weights") as progress:
        for name, shape in specs:
            tensor = _random_tensor(name, shape, dtype, generator, _fan_in(arch, name, shape))
            progress.update(tensor.nbytes)
            if block and FP8_WEIGHT.match(name):
                tensor, scale_inv = quantize_blocks(tensor, block)
                writer.add(name + SCALE_SUFFIX, scale_inv)
            writer.add(name, tensor)
    writer.close()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def make_model(
    arch: str,
    preset: str,
    out_dir: Path,
    dtype: str | None = None,
    seed: int = 0,
    config_only: bool = False,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    sparse: Pattern | None = None,
    layers: int | None = None,
    sparse_values: torch.dtype | None = None,
    fp8_block: bool = False,
) -> Path:
    """Write a model folder (config.json, generation_config.json, tokenizer, random safetensors weights) to out_dir.

    `layers` keeps only the first N decoder layers of the preset (a real layer shape at a fraction of the size).
    `sparse` (config only) marks the config as a packed samoyeds checkpoint of that pattern, so that vLLM with
    load_format="dummy" allocates only the packed expert weights: models too large for the GPU when dense load;
    `sparse_values` (FP8) marks those values quantized. `fp8_block` writes a checkpoint quantized like Qwen3-*-FP8
    (128 x 128 blocks, tools/fp8_blocks.py), with weights or config only (what vLLM's dense FP8 MoE runs); with
    `sparse`, the packed checkpoint converted from one, whose other layers stay FP8.

    Everything is written into a hidden sibling folder that is renamed to out_dir at the end, so a failed or
    interrupted run leaves no out_dir (and, with force, the previous one untouched). Returns out_dir.
    """
    given = Path(out_dir)  # as the user spelled it, for messages (as convert's)
    out_dir = Path(os.path.abspath(out_dir))  # so "." has a name and a parent, without following symlinks
    arch = ALIASES.get(arch, arch)
    hf_config = load_preset(arch, preset)
    text = text_config(hf_config)  # the language model's part (hf_config itself but for multimodal models)
    if layers is not None:
        if not 1 <= layers <= text["num_hidden_layers"]:
            raise SamoyedsError(f"--layers must be between 1 and the preset's {text['num_hidden_layers']} layers")
        moe_layer = getattr(_LAYOUTS.get(arch), "moe_layer", None)
        if moe_layer is not None and not any(moe_layer(text, layer) for layer in range(layers)):
            first = next((layer for layer in range(text["num_hidden_layers"]) if moe_layer(text, layer)), None)
            raise SamoyedsError(
                f"--layers {layers}: the first {layers} layer(s) of {arch} ({preset}) are dense MLPs, so the model "
                "would have no routed experts to make sparse"
                + (f"; keep at least {first + 1}" if first is not None else "")
            )
        text["num_hidden_layers"] = layers
    if not config_only and arch not in _weight_families():
        raise SamoyedsError(
            f"random weights for {arch} are not supported (supported: {', '.join(_weight_families())}); "
            "use --config-only to write its config and tokenizer"
        )
    if fp8_block and arch in _VISION_TOWERS:  # vLLM builds Llama-4's vision tower unquantized: no FP8 weights there
        raise SamoyedsError(f"--fp8-block writes text models only, not multimodal {arch}")
    if sparse is not None:
        if not config_only:
            raise SamoyedsError(
                "--sparse describes packed weights for load_format=dummy: use it with --config-only "
                "(to sparsify real weights, make the model dense and run `samoyeds-vllm convert`)"
            )
        globs = architecture_of(hf_config).sparse_module_globs()
        # with fp8_block: converted from the FP8 checkpoint, whose other layers it keeps (format version 3)
        other_layers = fp8_block_config(_not_fp8_modules(hf_config)) if fp8_block else None
        hf_config["quantization_config"] = quantization_config(sparse, globs, "dummy", sparse_values, other_layers)
    elif sparse_values is not None:
        raise SamoyedsError("quantized sparse values (--values) describe a --sparse checkpoint")
    if dtype is not None:
        if dtype not in DTYPES:
            raise SamoyedsError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        hf_config["torch_dtype"] = dtype
    if fp8_block and sparse is None:
        hf_config["quantization_config"] = fp8_block_config(_not_fp8_modules(hf_config))
    check_output_dir(given, force)
    if not config_only:
        check_free_space({out_dir: weights_bytes(hf_config)}, f"{preset} with random weights")
    with staged_dirs(out_dir, replace=force) as (work_dir,):
        token_ids = build_tokenizer(work_dir, text["vocab_size"])
        text.update(bos_token_id=token_ids["bos"], eos_token_id=token_ids["eos"], pad_token_id=token_ids["pad"])
        _write_json(work_dir / "config.json", hf_config)
        # Chat replies end with <|im_end|>, plain text with <|endoftext|>: generation stops on either.
        _write_json(
            work_dir / "generation_config.json",
            {
                "bos_token_id": token_ids["bos"],
                "eos_token_id": [token_ids["eos"], token_ids["im_end"]],
                "pad_token_id": token_ids["pad"],
            },
        )
        if not config_only:
            write_weights(work_dir, hf_config, seed, max_shard_bytes)
    return out_dir


def preset_model(
    preset: str,
    out_dir: Path,
    sparse: Pattern | None = None,
    sparse_values: torch.dtype | None = None,
    fp8_block: bool = False,
) -> Path:
    """A config-only model of a preset for load_format="dummy", replacing out_dir: as vLLM serves it dense (FP8
    block-quantized with fp8_block), or marked as a packed `sparse` checkpoint, its values quantized with
    sparse_values (what the end-to-end benchmarks and the decode profile run)."""
    return make_model(
        preset_family(preset),
        preset,
        out_dir,
        config_only=True,
        force=True,
        sparse=sparse,
        sparse_values=sparse_values,
        fp8_block=fp8_block,
    )


@dataclass(frozen=True)
class ModelForm:
    """How a model is stored: its routed experts dense (pattern None) as vLLM serves it, or packed in `pattern`;
    `fp8`: FP8 block-128 projections for a dense model, FP8 kept values for a packed one; `from_fp8` (packed only):
    converted from an FP8 block-quantized checkpoint, whose other projections it keeps in FP8 (format version 3)."""

    pattern: str | None = None  # "samoyeds" or "2:4"
    fp8: bool = False
    from_fp8: bool = False

    def __post_init__(self):
        if self.from_fp8 and self.dense:
            raise ValueError("from_fp8 describes a packed checkpoint; a dense FP8 one is ModelForm(fp8=True)")

    @property
    def dense(self) -> bool:
        return self.pattern is None

    @property
    def fp8_projections(self) -> bool:
        """FP8 128x128-block linear layers (the dense FP8 form, and a packed one converted from it), which vLLM runs
        through DeepGEMM on Hopper where DeepGEMM is installed (the GPU bundle has it)."""
        return (self.dense and self.fp8) or self.from_fp8

    @property
    def needs_cuda(self) -> bool:
        """vLLM's CPU backend has no FP8 block-quantized linear or MoE; our FP8 values have a CPU reference."""
        return self.fp8_projections

    def parsed_pattern(self, segment: int | None) -> Pattern | None:
        return None if self.dense else Pattern.parse(self.pattern, segment if self.pattern == "samoyeds" else None)

    def describe(self, segment: int | None = None) -> str:
        if self.dense:
            return "dense, FP8 128x128 blocks" if self.fp8 else "dense, bf16"
        other = ", FP8 128x128 blocks elsewhere" if self.from_fp8 else ""
        return f"{self.parsed_pattern(segment)}, {'FP8' if self.fp8 else 'bf16'} values{other}"

    def __call__(self, preset: str, segment: int | None, out: Path) -> Path:
        """The preset's config-only model in this form (preset_model)."""
        if self.dense:
            return preset_model(preset, out, fp8_block=self.fp8)
        from ..format import FP8

        return preset_model(
            preset, out, self.parsed_pattern(segment), FP8 if self.fp8 else None, fp8_block=self.from_fp8
        )


#: The forms the end-to-end benchmarks serve and `samoyeds-vllm fit` counts, by name.
FORMS = {
    "dense": ModelForm(),
    "dense-fp8": ModelForm(fp8=True),
    "samoyeds": ModelForm("samoyeds"),
    "samoyeds-fp8": ModelForm("samoyeds", fp8=True),
    "2of4": ModelForm("2:4"),
    "2of4-fp8": ModelForm("2:4", fp8=True),
}
