"""Make Hugging Face MoE checkpoints with random weights, for tests and benchmarks without hub downloads.

A preset (configs/models/*.json) is a real config.json. The weights are written as the hub has them, one tensor per
expert and projection, because that is the layout vLLM, transformers and our converter read. Names and shapes come
from a small per-family table rather than from instantiating transformers models: transformers 5 fuses experts
internally, and real presets are far too large to instantiate.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import SamoyedsError
from ..format import Pattern, quantization_config
from .architectures import ARCHITECTURES, DOWN, architecture_of
from .checkpoint_io import DEFAULT_MAX_SHARD_BYTES, DTYPES, ShardedWriter, check_output_dir, staged_dirs
from .fp8_blocks import SCALE_SUFFIX, block_size, fp8_block_config, quantize_blocks
from .presets import load_preset, preset_family
from .tokenizer import build_tokenizer

TensorSpec = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class _Layout:
    """What differs between the families' checkpoints, beyond what architectures.Architecture records."""

    num_experts_key: str  # config key: routed experts per layer
    expert_size_key: str  # config key: routed expert intermediate size
    attention: str = "mha"  # "mha": q/k/v/o_proj; "mla": DeepSeek's multi-head latent attention
    attention_bias: str | None = None  # "qkv": q/k/v always have biases; "config": q/k/v/o if attention_bias
    qk_norm: str | None = None  # "per_head": q_norm/k_norm over head_dim; "all_heads": over heads * head_dim
    #: "qwen2": mlp.shared_expert.* (shared_expert_intermediate_size) and mlp.shared_expert_gate;
    #: "deepseek": mlp.shared_experts.*, n_shared_experts experts wide, without a gate
    shared_expert: str | None = None
    #: The config keys that make some layers dense MLPs: "qwen": mlp_only_layers / decoder_sparse_step;
    #: "deepseek": the first first_k_dense_replace layers, then all but every moe_layer_freq-th
    dense_layers: str | None = None
    router_bias: bool = False  # gate.e_score_correction_bias: DeepSeek-V3's per-expert score correction


_DEEPSEEK = _Layout(
    "n_routed_experts", "moe_intermediate_size", attention="mla", shared_expert="deepseek", dense_layers="deepseek"
)
_LAYOUTS = {
    "mixtral": _Layout("num_local_experts", "intermediate_size"),
    "qwen2_moe": _Layout(
        "num_experts", "moe_intermediate_size", attention_bias="qkv", shared_expert="qwen2", dense_layers="qwen"
    ),
    "qwen3_moe": _Layout(
        "num_experts", "moe_intermediate_size", attention_bias="config", qk_norm="per_head", dense_layers="qwen"
    ),
    "olmoe": _Layout("num_experts", "intermediate_size", attention_bias="config", qk_norm="all_heads"),
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": replace(_DEEPSEEK, router_bias=True),
}


def _attention_shapes(layout: _Layout, c: dict) -> dict[str, tuple[int, ...]]:
    """The attention's weights, norms included (module name inside self_attn -> shape of its `weight`)."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    if layout.attention == "mha":
        kv_heads = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or hidden // heads
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        shapes = {"q_proj": (q_size, hidden), "k_proj": (kv_size, hidden), "v_proj": (kv_size, hidden)}
        shapes["o_proj"] = (hidden, q_size)
        if norms := {"per_head": (head_dim, head_dim), "all_heads": (q_size, kv_size)}.get(layout.qk_norm):
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
    if model_type not in _LAYOUTS:
        raise SamoyedsError(
            f"cannot make weights for model_type {model_type!r}; supported: {', '.join(_LAYOUTS)} "
            "(other families: config only)"
        )
    arch, layout, c = ARCHITECTURES[model_type], _LAYOUTS[model_type], hf_config
    if layout.router_bias and c.get("topk_method") != "noaux_tc":
        # transformers always has the bias, vLLM only with noaux_tc: no checkpoint would load in both
        raise SamoyedsError(f"{model_type}: topk_method {c.get('topk_method')!r} is not supported, only noaux_tc")
    hidden = c["hidden_size"]
    num_experts, expert_size = c[layout.num_experts_key], c[layout.expert_size_key]
    attention = _attention_shapes(layout, c)

    biases = {
        "qkv": ["q_proj", "k_proj", "v_proj"],
        "config": ["q_proj", "k_proj", "v_proj", "o_proj"] if c.get("attention_bias") else [],
    }
    bias_projs = biases.get(layout.attention_bias, [])

    def mlp(prefix: str, size: int) -> list[TensorSpec]:
        return [
            (f"{prefix}.gate_proj.weight", (size, hidden)),
            (f"{prefix}.up_proj.weight", (size, hidden)),
            (f"{prefix}.down_proj.weight", (hidden, size)),
        ]

    def is_moe(layer: int) -> bool:
        if layout.dense_layers == "qwen":
            return (
                layer not in c.get("mlp_only_layers", [])
                and num_experts > 0
                and (layer + 1) % c.get("decoder_sparse_step", 1) == 0
            )
        if layout.dense_layers == "deepseek":  # as vLLM's and DeepSeek's own modeling code decide
            return layer >= c.get("first_k_dense_replace", 0) and layer % c.get("moe_layer_freq", 1) == 0
        return True

    specs: list[TensorSpec] = [("model.embed_tokens.weight", (c["vocab_size"], hidden))]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        specs += [(f"{p}.input_layernorm.weight", (hidden,)), (f"{p}.post_attention_layernorm.weight", (hidden,))]
        specs += [(f"{p}.self_attn.{module}.weight", shape) for module, shape in attention.items()]
        specs += [(f"{p}.self_attn.{proj}.bias", attention[proj][:1]) for proj in bias_projs]
        if not is_moe(layer):
            specs += mlp(f"{p}.mlp", c["intermediate_size"])
            continue
        specs.append((f"{p}.{arch.moe_block}.gate.weight", (num_experts, hidden)))
        if layout.router_bias:
            specs.append((f"{p}.{arch.moe_block}.gate.e_score_correction_bias", (num_experts,)))
        for expert in range(num_experts):
            specs += [
                (
                    arch.expert_weight_name(layer, expert, proj),
                    (hidden, expert_size) if role == DOWN else (expert_size, hidden),
                )
                for proj, role in arch.projections.items()
            ]
        if layout.shared_expert == "qwen2":
            specs += mlp(f"{p}.mlp.shared_expert", c["shared_expert_intermediate_size"])
            specs.append((f"{p}.mlp.shared_expert_gate.weight", (1, hidden)))
        elif layout.shared_expert == "deepseek" and c.get("n_shared_experts"):
            specs += mlp(f"{p}.mlp.shared_experts", expert_size * c["n_shared_experts"])
    specs.append(("model.norm.weight", (hidden,)))
    if not c.get("tie_word_embeddings", False):
        specs.append(("lm_head.weight", (c["vocab_size"], hidden)))
    return specs


def _random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Norm weights 1 and biases 0, as trained models start; matrices with std 1/sqrt(fan_in), so every layer
    changes the residual stream as much as a trained one (with the usual std 0.02 the embeddings dominate and
    the experts barely affect the output, which would make token comparisons blind to expert bugs).

    Drawn in float32 (3x faster on CPU than drawing bfloat16), so one seed gives the same weights in every dtype.
    """
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype)
    std = shape[-1] ** -0.5
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator).to(dtype)


#: The weights an FP8 block-quantized checkpoint stores in FP8: attention, expert and MLP projections (Qwen3-FP8
#: and DeepSeek-V3 keep embeddings, norms, routers and the LM head in bf16).
_FP8_WEIGHT = re.compile(r".*(_proj|\.w[123])\.weight$")


def _not_fp8_modules(hf_config: dict) -> list[str]:
    """modules_to_not_convert of an FP8 block config: the linear layers that stay unquantized (routers, LM head)."""
    names = [name.removesuffix(".weight") for name, shape in weight_specs(hf_config) if len(shape) == 2]
    return [n for n in names if not _FP8_WEIGHT.match(n + ".weight") and not n.endswith("embed_tokens")]


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
    with tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="random weights") as progress:
        for name, shape in specs:
            tensor = _random_tensor(name, shape, dtype, generator)
            progress.update(tensor.nbytes)
            if block and _FP8_WEIGHT.match(name):
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
    (128 x 128 blocks, tools/fp8_blocks.py), with weights or config only (what vLLM's dense FP8 MoE runs).

    Everything is written into a hidden sibling folder that is renamed to out_dir at the end, so a failed or
    interrupted run leaves no out_dir (and, with force, the previous one untouched). Returns out_dir.
    """
    out_dir = Path(os.path.abspath(out_dir))  # so "." has a name and a parent, without following symlinks
    hf_config = load_preset(arch, preset)
    if layers is not None:
        if not 1 <= layers <= hf_config["num_hidden_layers"]:
            raise SamoyedsError(f"--layers must be between 1 and the preset's {hf_config['num_hidden_layers']} layers")
        hf_config["num_hidden_layers"] = layers
    if not config_only and arch not in _LAYOUTS:
        raise SamoyedsError(
            f"random weights for {arch} are not supported (supported: {', '.join(_LAYOUTS)}); "
            "use --config-only to write its config and tokenizer"
        )
    if sparse is not None:
        if not config_only:
            raise SamoyedsError(
                "--sparse describes packed weights for load_format=dummy: use it with --config-only "
                "(to sparsify real weights, make the model dense and run `samoyeds-vllm convert`)"
            )
        if fp8_block:
            raise SamoyedsError("--sparse and --fp8-block exclude each other (--values fp8 quantizes sparse values)")
        globs = architecture_of(hf_config).sparse_module_globs()
        hf_config["quantization_config"] = quantization_config(sparse, globs, "dummy", sparse_values)
    elif sparse_values is not None:
        raise SamoyedsError("quantized sparse values (--values) describe a --sparse checkpoint")
    if dtype is not None:
        if dtype not in DTYPES:
            raise SamoyedsError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        hf_config["torch_dtype"] = dtype
    if fp8_block:
        hf_config["quantization_config"] = fp8_block_config(_not_fp8_modules(hf_config))
    check_output_dir(out_dir, force)
    with staged_dirs(out_dir, replace=force) as (work_dir,):
        token_ids = build_tokenizer(work_dir, hf_config["vocab_size"])
        hf_config.update(bos_token_id=token_ids["bos"], eos_token_id=token_ids["eos"], pad_token_id=token_ids["pad"])
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
