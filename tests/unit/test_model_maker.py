"""make-model: tiny random models that transformers loads exactly, real presets as config only, and clean failures."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers import hf_model, leftovers, read_checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer

from samoyeds_vllm.cli import main
from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.tools import checkpoint_io
from samoyeds_vllm.tools.architectures import ARCHITECTURES, MoEShape, moe_shape, text_config
from samoyeds_vllm.tools.checkpoint_io import CheckpointReader
from samoyeds_vllm.tools.fused_experts import per_expert
from samoyeds_vllm.tools.model_maker import make_model, weight_specs, write_weights
from samoyeds_vllm.tools.presets import available_presets, load_preset
from samoyeds_vllm.tools.tokenizer import (
    CHAT_TEMPLATE,
    CORPUS,
    DEFAULT_VOCAB_SIZE,
    IM_END,
    IM_START,
    build_tokenizer,
)

FAMILIES = sorted(ARCHITECTURES)
REAL_PRESETS = sorted(name for name in available_presets() if not name.startswith("tiny-"))


def load_exactly(model_dir: Path):
    """Load with transformers and fail on any key it had to skip or make up: the names must be the hub's."""
    model, info = hf_model(model_dir)
    assert {key: value for key, value in info.items() if value} == {}
    return model


# --- tiny models of every family --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", FAMILIES)
def test_tiny_model_loads_in_transformers_and_generates(tiny_models, arch):
    model_dir = tiny_models[arch]
    model = load_exactly(model_dir)
    assert type(model).__name__ == ARCHITECTURES[arch].hf_class
    assert model.dtype == torch.float32

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    prompt = tokenizer("The quick brown fox", return_tensors="pt")
    output = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    again = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert output.shape == (1, prompt["input_ids"].shape[1] + 4)
    assert torch.equal(output, again)
    assert int(output.max()) < model.config.get_text_config().vocab_size
    assert tokenizer.decode(output[0]).startswith("The quick brown fox")


@pytest.mark.parametrize("arch", FAMILIES)
def test_tiny_checkpoint_has_hub_names_and_init(tiny_models, arch):
    model_dir = tiny_models[arch]
    config = json.loads((model_dir / "config.json").read_text())
    tensors = read_checkpoint(model_dir)
    assert [(name, tuple(tensors[name].shape)) for name, _ in weight_specs(config)] == [
        (name, shape) for name, shape in weight_specs(config)
    ]
    assert set(tensors) == {name for name, _ in weight_specs(config)}

    family = ARCHITECTURES[arch]
    reader = per_expert(CheckpointReader(model_dir), family)  # checked as the converter reads them
    experts = [name for name in reader.names() if family.expert_weight_re.match(name)]
    router_re = re.compile(rf"^{re.escape(family.layers_prefix)}(\d+)\..*\.(gate|router)\.weight$")
    routers = {int(m[1]) for name in tensors if (m := router_re.match(name))}
    num_experts = moe_shape(config).num_experts
    assert family.experts_per_layer(experts) == dict.fromkeys(sorted(routers), num_experts)
    assert len(experts) == len(routers) * num_experts * 3
    for name in experts:  # every expert weight dimension is a whole number of 128-wide sparse segments
        assert all(dim % 128 == 0 for dim in reader.shape(name)), name

    for name, tensor in tensors.items():
        assert tensor.dtype == torch.float32
        if re.search(r"norm[^.]*\.weight$", name):  # RMSNorms and LayerNorms (a ViT's layernorm_pre)
            assert torch.all(tensor == 1), name
        elif name.endswith(".bias"):
            assert torch.all(tensor == 0), name
        elif tensor.numel() >= 1000:  # std 1/sqrt(inputs): fused experts are [E, in, out]
            inputs = tensor.shape[-2] if tensor.dim() == 3 else tensor.shape[-1]
            assert tensor.std().item() == pytest.approx(inputs**-0.5, rel=0.1), name


def test_family_specific_tensors(tiny_models):
    names = {arch: set(read_checkpoint(tiny_models[arch])) for arch in FAMILIES}
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in names["mixtral"]
    assert "model.layers.1.block_sparse_moe.gate.weight" in names["mixtral"]
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in names["qwen3_moe"]
    assert {
        "model.layers.0.mlp.shared_expert.gate_proj.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.0.self_attn.q_proj.bias",
    } <= names["qwen2_moe"]
    assert "model.layers.0.self_attn.o_proj.bias" not in names["qwen2_moe"]

    shapes = {
        arch: dict(weight_specs(json.loads((tiny_models[arch] / "config.json").read_text()))) for arch in FAMILIES
    }
    assert shapes["qwen3_moe"]["model.layers.0.self_attn.q_norm.weight"] == (64,)  # head_dim
    assert shapes["olmoe"]["model.layers.0.self_attn.q_norm.weight"] == (128,)  # heads * head_dim
    assert shapes["olmoe"]["model.layers.0.self_attn.k_norm.weight"] == (64,)  # kv_heads * head_dim
    assert shapes["qwen2_moe"]["model.layers.0.mlp.shared_expert_gate.weight"] == (1, 128)
    assert shapes["mixtral"]["model.layers.0.block_sparse_moe.experts.0.w2.weight"] == (128, 256)
    # GLM-4.5: a dense first layer, q/k/v biases (not o), per-head q/k norms, shared experts and the routers'
    # score-correction biases
    glm = shapes["glm4_moe"]
    assert glm["model.layers.0.mlp.gate_proj.weight"] == (256, 128)
    assert not any(name.startswith("model.layers.0.mlp.experts.") for name in glm)
    assert glm["model.layers.1.mlp.gate.e_score_correction_bias"] == (16,)
    assert glm["model.layers.2.mlp.shared_experts.down_proj.weight"] == (128, 128)
    assert glm["model.layers.1.self_attn.k_proj.bias"] == (64,) and "model.layers.1.self_attn.o_proj.bias" not in glm
    assert glm["model.layers.1.self_attn.q_norm.weight"] == (32,)
    # Llama-4: MoE every second layer (dense MLPs of intermediate_size_mlp between), experts fused as the hub
    # has them ([E, in, out], gate and up side by side), a router and a shared expert
    llama4 = shapes["llama4_text"]
    assert llama4["model.layers.0.feed_forward.gate_proj.weight"] == (256, 128)
    assert llama4["model.layers.1.feed_forward.experts.gate_up_proj"] == (8, 128, 256)
    assert llama4["model.layers.3.feed_forward.experts.down_proj"] == (8, 128, 128)
    assert llama4["model.layers.1.feed_forward.router.weight"] == (8, 128)
    assert llama4["model.layers.1.feed_forward.shared_expert.up_proj.weight"] == (128, 128)
    assert not any(".experts.0." in name for name in llama4)  # no per-expert tensors
    assert not any("self_attn" in name and "norm" in name for name in llama4)  # its q/k norms have no weights
    # Multimodal Llama-4: the same language model under language_model., beside a ViT (biases, LayerNorms), its
    # pixel-shuffle adapter and the projector into the text embeddings
    multimodal = shapes["llama4"]
    assert {name: shape for name, shape in multimodal.items() if name.startswith("language_model.")} == {
        f"language_model.{name}": shape for name, shape in llama4.items()
    }
    assert multimodal["vision_model.patch_embedding.linear.weight"] == (64, 3 * 14 * 14)
    assert multimodal["vision_model.positional_embedding_vlm"] == ((56 // 14) ** 2 + 1, 64)
    assert multimodal["vision_model.model.layers.1.self_attn.o_proj.bias"] == (64,)
    assert multimodal["vision_model.model.layers.1.post_attention_layernorm.bias"] == (64,)
    assert multimodal["vision_model.vision_adapter.mlp.fc1.weight"] == (128, 256)  # pixel shuffle: 4 x 64 inputs
    assert multimodal["multi_modal_projector.linear_1.weight"] == (128, 128)
    assert all(any(name.endswith("lm_head.weight") for name in s) for s in shapes.values())

    # DeepSeek: MLA (V3's queries through q_lora_rank 64, V2's straight), a leading dense layer, one shared expert
    # of the routed experts' width, V3's score-correction bias
    v2, v3 = shapes["deepseek_v2"], shapes["deepseek_v3"]
    assert v3["model.layers.0.self_attn.q_a_proj.weight"] == (64, 128)
    assert v3["model.layers.0.self_attn.q_a_layernorm.weight"] == (64,)
    assert v3["model.layers.0.self_attn.q_b_proj.weight"] == (4 * (32 + 32), 64)
    assert v2["model.layers.0.self_attn.q_proj.weight"] == (4 * (32 + 32), 128)
    assert "model.layers.0.self_attn.q_a_proj.weight" not in v2 and "model.layers.0.self_attn.q_proj.weight" not in v3
    for s in (v2, v3):
        assert s["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (64 + 32, 128)  # latent + rope key
        assert s["model.layers.0.self_attn.kv_a_layernorm.weight"] == (64,)
        assert s["model.layers.0.self_attn.kv_b_proj.weight"] == (4 * (32 + 32), 64)  # nope key + value per head
        assert s["model.layers.0.self_attn.o_proj.weight"] == (128, 4 * 32)
        assert s["model.layers.0.mlp.gate_proj.weight"] == (256, 128)
        assert not any(name.startswith("model.layers.0.mlp.experts.") for name in s)
        assert s["model.layers.1.mlp.shared_experts.down_proj.weight"] == (128, 128)
        assert s["model.layers.2.mlp.experts.15.up_proj.weight"] == (128, 128)
    assert v3["model.layers.1.mlp.gate.e_score_correction_bias"] == (16,)
    assert not any(name.endswith("e_score_correction_bias") for name in v2)


def test_tiny_presets_fit_the_sparse_pattern():
    for arch in FAMILIES:
        config = load_preset(arch, "tiny")
        assert config["model_type"] == arch and config["architectures"] == [ARCHITECTURES[arch].hf_class]
        assert text_config(config)["hidden_size"] % 128 == 0 and config["torch_dtype"] == "float32"
    assert load_preset("qwen3_moe", "tiny")["norm_topk_prob"] is True
    assert load_preset("qwen2_moe", "tiny")["norm_topk_prob"] is False
    assert load_preset("olmoe", "tiny")["norm_topk_prob"] is False
    glm = load_preset("glm4_moe", "tiny")  # every routing step of GLM-4.5 takes effect
    assert glm["n_group"] > glm["topk_group"] > 1 and glm["routed_scaling_factor"] != 1 and glm["norm_topk_prob"]
    assert 0 < glm["first_k_dense_replace"] < glm["num_hidden_layers"] and glm["num_nextn_predict_layers"] == 0
    llama4 = load_preset("llama4_text", "tiny")  # interleaved MoE layers, a NoPE layer, top-1 as vLLM runs it
    assert llama4["interleave_moe_layer_step"] == 2 and 0 in llama4["no_rope_layers"]
    assert llama4["num_experts_per_tok"] == 1 and llama4["use_qk_norm"]
    multimodal = load_preset("llama4", "tiny")  # the same language model, a two-layer ViT beside it
    assert multimodal["text_config"] == {k: v for k, v in llama4.items() if k not in ("architectures", "torch_dtype")}
    # DeepSeek-V3's routing at a small size: sigmoid scores with a score-correction bias, top-2 of 4 groups, scaled
    v3 = load_preset("deepseek_v3", "tiny")
    assert (v3["scoring_func"], v3["topk_method"], v3["n_group"], v3["topk_group"]) == ("sigmoid", "noaux_tc", 4, 2)
    assert v3["routed_scaling_factor"] != 1 and v3["norm_topk_prob"] is True
    v2 = load_preset("deepseek_v2", "tiny")  # softmax, grouped, scaled, not renormalised (transformers never does)
    assert (v2["scoring_func"], v2["topk_method"], v2["norm_topk_prob"]) == ("softmax", "group_limited_greedy", False)
    assert v2["q_lora_rank"] is None and v2["routed_scaling_factor"] != 1


def test_variant_configs_load_exactly(tmp_path):
    """Branches the tiny presets do not take: tied embeddings, dense layers, attention biases."""
    variants = {
        "qwen2_moe": dict(load_preset("qwen2_moe", "tiny"), mlp_only_layers=[1], tie_word_embeddings=True),
        "qwen3_moe": dict(load_preset("qwen3_moe", "tiny"), decoder_sparse_step=2, attention_bias=True),
        "glm4_moe": dict(
            load_preset("glm4_moe", "tiny"), use_qk_norm=False, attention_bias=False, first_k_dense_replace=2
        ),
        "llama4_text": dict(load_preset("llama4_text", "tiny"), interleave_moe_layer_step=1),
        "deepseek_v2": dict(load_preset("deepseek_v2", "tiny"), q_lora_rank=64, first_k_dense_replace=0),
    }
    for arch, config in variants.items():
        model_dir = tmp_path / arch
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config))
        write_weights(model_dir, config)
        load_exactly(model_dir)
    names = {name for name, _ in weight_specs(variants["qwen2_moe"])}
    assert "lm_head.weight" not in names
    assert "model.layers.1.mlp.gate_proj.weight" in names and "model.layers.0.mlp.gate.weight" in names
    assert not any(name.startswith("model.layers.1.mlp.experts.") for name in names)
    assert "model.layers.0.self_attn.o_proj.bias" in {name for name, _ in weight_specs(variants["qwen3_moe"])}
    glm = {name for name, _ in weight_specs(variants["glm4_moe"])}
    assert not any("q_norm" in name or name.endswith(".bias") for name in glm)
    assert "model.layers.1.mlp.gate_proj.weight" in glm and "model.layers.2.mlp.gate.weight" in glm
    llama4 = {name for name, _ in weight_specs(variants["llama4_text"])}
    assert all(f"model.layers.{layer}.feed_forward.experts.gate_up_proj" in llama4 for layer in range(4))
    deepseek = {name for name, _ in weight_specs(variants["deepseek_v2"])}
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in deepseek  # no dense layer: experts from layer 0


@pytest.mark.parametrize(
    "arch, change, message",
    [
        ("deepseek_v3", {"attention_bias": True}, "attention_bias is not supported (vLLM's MLA layers have no biases)"),
        ("deepseek_v3", {"topk_method": "greedy"}, "topk_method 'greedy' is not supported, only noaux_tc"),
    ],
)
def test_unsupported_variants_are_refused(arch, change, message):
    with pytest.raises(SamoyedsError, match=re.escape(message)):
        weight_specs(dict(load_preset(arch, "tiny"), **change))


def test_same_seed_same_weights(tmp_path, tiny_models):
    same = make_model("mixtral", "tiny", tmp_path / "same", seed=0)
    other = make_model("mixtral", "tiny", tmp_path / "other", seed=1)
    reference = read_checkpoint(tiny_models["mixtral"])
    assert all(torch.equal(t, reference[name]) for name, t in read_checkpoint(same).items())
    assert not torch.equal(read_checkpoint(other)["model.embed_tokens.weight"], reference["model.embed_tokens.weight"])


def test_dtype_override(tmp_path, tiny_models):
    model_dir = make_model("qwen3_moe", "tiny", tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((model_dir / "config.json").read_text())["torch_dtype"] == "bfloat16"
    float32_weights = read_checkpoint(tiny_models["qwen3_moe"])
    for name, tensor in read_checkpoint(model_dir).items():  # the same seed rounds to the same weights
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, float32_weights[name].to(torch.bfloat16)), name
    assert load_exactly(model_dir).dtype == torch.bfloat16


# --- tokenizer ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return AutoTokenizer.from_pretrained(str(tiny_models["qwen3_moe"]))


def test_tokenizer_matches_config(tiny_models, tokenizer):
    for arch in FAMILIES:
        config = text_config(json.loads((tiny_models[arch] / "config.json").read_text()))
        generation = json.loads((tiny_models[arch] / "generation_config.json").read_text())
        assert len(tokenizer) <= config["vocab_size"]
        assert config["eos_token_id"] == config["pad_token_id"] == tokenizer.eos_token_id == tokenizer.pad_token_id
        assert generation["eos_token_id"] == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    assert tokenizer.eos_token == "<|endoftext|>"
    assert len(tokenizer) > 900  # BPE learnt whole words, not just bytes
    assert len(tokenizer("The model and the experts").input_ids) == 5


def test_tokenizer_has_a_token_for_every_id_of_the_model(tmp_path):
    """Ids past the trained ones decode to words, one DecodeStream step each, as a real tokenizer's do; text encodes
    back to the ids it came from (vllm bench serve's random prompts), and, looking whole words up first, as merges
    alone would encode it."""
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    build_tokenizer(tmp_path / "big", 151936)
    big = AutoTokenizer.from_pretrained(str(tmp_path / "big"))
    assert len(big) == 151936
    assert big.decode([100000]).startswith(" zq") and big.decode([100000]) != big.decode([100001])
    for start in (5000, 100000, 151800):
        ids = list(range(start, start + 64))
        assert big.encode(big.decode(ids), add_special_tokens=False) == ids
    spec = json.loads((tmp_path / "big" / "tokenizer.json").read_text())
    fast = Tokenizer.from_str(json.dumps(spec))
    spec["model"]["ignore_merges"] = False
    merges_only = Tokenizer.from_str(json.dumps(spec))
    for text in [*CORPUS.splitlines(), "Hello! 42 apples, <|im_end|> zq zqa Zq \u00e9t\u00e9 \u6f22\u5b57"]:
        assert fast.encode(text).ids == merges_only.encode(text).ids, text
    assert max(fast.encode(CORPUS).ids) < DEFAULT_VOCAB_SIZE
    stream = DecodeStream(skip_special_tokens=True)
    steps = [stream.step(fast, i) for i in (100000, 5, 150000)]
    assert steps == [big.decode([100000]), big.decode([5]), big.decode([150000])]


def test_tokenizer_fits_small_vocabularies(tmp_path):
    ids = build_tokenizer(tmp_path / "small", 300)
    assert ids == {"bos": 0, "eos": 0, "pad": 0, "im_start": 1, "im_end": 2}
    assert len(AutoTokenizer.from_pretrained(str(tmp_path / "small"))) == 300
    with pytest.raises(SamoyedsError, match="too small for a byte-level tokenizer"):
        build_tokenizer(tmp_path / "tiny", 200)


def test_tokenizer_is_deterministic(tmp_path, tiny_models):
    model_dir = make_model("olmoe", "tiny", tmp_path / "again", config_only=True)
    assert (model_dir / "tokenizer.json").read_bytes() == (tiny_models["qwen3_moe"] / "tokenizer.json").read_bytes()


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127)))
def test_tokenizer_round_trips_ascii(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text


def test_chat_template(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.chat_template == CHAT_TEMPLATE
    ids = tokenizer(text).input_ids
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == 3  # special tokens stay single tokens
    assert tokenizer.decode(ids, skip_special_tokens=True) == "system\nBe brief.\nuser\nHello there!\nassistant\n"


# --- sharding and real presets ------------------------------------------------------------------------------------


def test_sharded_checkpoint_index_covers_every_tensor(tmp_path):
    max_shard_bytes = 1024 * 1024
    model_dir = make_model("qwen2_moe", "tiny", tmp_path / "sharded", max_shard_bytes=max_shard_bytes)
    config = json.loads((model_dir / "config.json").read_text())
    specs = weight_specs(config)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert len(files) > 2
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    assert not (model_dir / "model.safetensors").exists()
    assert set(index["weight_map"]) == {name for name, _ in specs}
    assert index["metadata"]["total_size"] == sum(math.prod(shape) * 4 for _, shape in specs)

    for file in files:
        with safe_open(str(model_dir / file), framework="pt") as f:
            names = set(f.keys())
            shard_bytes = sum(math.prod(f.get_slice(name).get_shape()) * 4 for name in names)
        assert names == {name for name, owner in index["weight_map"].items() if owner == file}
        assert shard_bytes <= max_shard_bytes or len(names) == 1
    load_exactly(model_dir)


@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_real_preset_config_only(tmp_path, preset):
    arch = available_presets()[preset]
    model_dir = make_model(arch, preset, tmp_path / preset, config_only=True)
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    written = json.loads((model_dir / "config.json").read_text())
    preset_config = load_preset(arch, preset)
    token_keys = {"bos_token_id", "eos_token_id", "pad_token_id"}  # the tokenizer's, in the language model's config

    def without_tokens(config: dict) -> dict:
        text = {k: v for k, v in text_config(config).items() if k not in token_keys}
        return dict(config, text_config=text) if "text_config" in config else text

    assert without_tokens(written) == without_tokens(preset_config)
    assert written["torch_dtype"] == "bfloat16" and "auto_map" not in written

    config = AutoConfig.from_pretrained(str(model_dir))
    vocab = config.get_text_config().vocab_size
    assert config.model_type == arch and vocab == text_config(preset_config)["vocab_size"]
    assert len(AutoTokenizer.from_pretrained(str(model_dir))) <= vocab


def test_real_preset_shapes_match_published_parameter_counts():
    billions = {
        "mixtral-8x7b": 46.70,
        "qwen3-30b-a3b": 30.53,
        "qwen3-235b-a22b": 235.09,
        "qwen1.5-moe-a2.7b": 14.32,
        "olmoe-1b-7b": 6.92,
        "deepseek-v2-lite": 15.71,
        "deepseek-v3": 671.03,  # without its multi-token-prediction layer (vLLM serves it as a draft model)
        # the hub's parameter counts, vision tower included (from memory: these presets are unchecked, docs/design.md)
        "llama4-scout-17b-16e-mm": 108.64,
        "llama4-maverick-17b-128e": 401.58,
    }
    for preset, expected in billions.items():
        specs = weight_specs(load_preset(available_presets()[preset], preset))
        assert sum(math.prod(shape) for _, shape in specs) / 1e9 == pytest.approx(expected, abs=0.01), preset


def test_llama4_maverick_preset():
    """Maverick: 128 routed experts and a shared expert in every second layer (dense MLPs of intermediate_size_mlp
    between), top-1, the multimodal layout of its hub checkpoints."""
    config = load_preset("llama4", "llama4-maverick-17b-128e")
    assert moe_shape(config) == MoEShape(num_experts=128, hidden=5120, intermediate=8192, top_k=1)
    text = config["text_config"]
    assert (text["interleave_moe_layer_step"], text["intermediate_size_mlp"], text["num_hidden_layers"]) == (
        2,
        16384,
        48,
    )
    names = dict(weight_specs(config))
    routed = [n for n in names if n.endswith("feed_forward.experts.gate_up_proj")]
    assert len(routed) == 24 and names["language_model.model.layers.47.feed_forward.experts.down_proj"] == (
        128,
        8192,
        5120,
    )
    assert names["language_model.model.layers.1.feed_forward.shared_expert.gate_proj.weight"] == (8192, 5120)
    assert names["language_model.model.layers.0.feed_forward.gate_proj.weight"] == (16384, 5120)


# --- errors -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, preset, kwargs, message",
    [
        (
            "gpt2",
            "tiny",
            {},
            "unknown architecture 'gpt2'; supported: deepseek_v2, deepseek_v3, glm4_moe, kimi_k2, llama4, "
            "llama4_text, mixtral, olmoe, qwen2_moe, qwen3_moe",
        ),
        (
            "qwen3_moe",
            "qwen3-7b",
            {},
            "no preset 'qwen3-7b' for qwen3_moe; presets for qwen3_moe: qwen3-235b-a22b, qwen3-30b-a3b, tiny",
        ),
        ("qwen3_moe", "mixtral-8x7b", {}, "preset 'mixtral-8x7b' is a mixtral model, not qwen3_moe"),
        (
            "deepseek_v3",
            "deepseek-7b",
            {"config_only": True},
            "no preset 'deepseek-7b' for deepseek_v3; presets for deepseek_v3: deepseek-v3, kimi-k2, tiny",
        ),
        ("mixtral", "tiny", {"dtype": "int8"}, "unknown dtype 'int8'; choose one of float32, bfloat16, float16"),
        ("mixtral", "tiny", {"max_shard_bytes": 0}, "max_shard_bytes must be positive"),
        ("llama4", "tiny", {"fp8_block": True}, "--fp8-block writes text models only, not multimodal llama4"),
    ],
)
def test_bad_input_is_refused_and_leaves_nothing(tmp_path, arch, preset, kwargs, message):
    with pytest.raises(SamoyedsError, match=re.escape(message)):
        make_model(arch, preset, tmp_path / "out", **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("preset", ["tiny", "kimi-k2"])
def test_an_alias_makes_the_family_it_names(tmp_path, preset):
    """kimi_k2 checkpoints are DeepSeek-V3's architecture (architectures.ALIASES): --arch kimi_k2 makes its presets."""
    out = make_model("kimi_k2", preset, tmp_path / "out", config_only=True)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3"
    assert config["hidden_size"] == load_preset("deepseek_v3", preset)["hidden_size"]


def test_existing_out_dir_needs_force(tmp_path, tiny_models, monkeypatch):
    out_dir = tmp_path / "model"
    make_model("olmoe", "tiny", out_dir, seed=0)
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SamoyedsError, match="^output directory model already exists; .*--force"):
        make_model("olmoe", "tiny", "model", seed=1)  # the path as given, as convert names it
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before

    make_model("mixtral", "tiny", out_dir, seed=1, force=True)
    assert json.loads((out_dir / "config.json").read_text())["model_type"] == "mixtral"
    assert leftovers(tmp_path) == []


def test_force_refuses_a_folder_that_is_not_a_model(tmp_path):
    precious = tmp_path / "notes"
    precious.mkdir()
    (precious / "todo.txt").write_text("keep me")
    with pytest.raises(SamoyedsError, match="does not look like a model"):
        make_model("mixtral", "tiny", precious, force=True)
    assert (precious / "todo.txt").read_text() == "keep me" and leftovers(tmp_path) == []


def test_failure_while_writing_leaves_no_output(tmp_path, monkeypatch):
    previous = make_model("mixtral", "tiny", tmp_path / "previous")
    before = {p.name: p.read_bytes() for p in previous.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_io, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        make_model("mixtral", "tiny", tmp_path / "new")
    with pytest.raises(OSError, match="No space left"):
        make_model("mixtral", "tiny", previous, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous"]
    assert {p.name: p.read_bytes() for p in previous.iterdir()} == before


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"samoyeds-vllm \d+\.\d+\.\d+\S*, vLLM 0\.26\.0\S*\n", capsys.readouterr().out)


def test_cli(tmp_path, capsys):
    assert (
        main(
            [
                "make-model",
                "--arch",
                "qwen3_moe",
                "--preset",
                "tiny",
                "--out",
                str(tmp_path / "m"),
                "--dtype",
                "bfloat16",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "m" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (tmp_path / "m" / "model.safetensors").is_file()
    capsys.readouterr()

    assert main(["make-model", "--arch", "qwen3_moe", "--out", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == (
        f"samoyeds-vllm make-model: error: output directory {tmp_path / 'm'} already "
        "exists; choose another path or pass --force to replace it\n"
    )


def test_config_only_sparse_marks_a_packed_checkpoint(tmp_path):
    from samoyeds_vllm.format import Pattern

    model = make_model(
        "qwen3_moe", "qwen3-30b-a3b", tmp_path / "m", config_only=True, sparse=Pattern.parse("samoyeds", 64)
    )
    quant = json.loads((model / "config.json").read_text())["quantization_config"]
    assert (quant["quant_method"], quant["format_version"], quant["segment"]) == ("samoyeds", 1, 64)
    assert not list(model.glob("*.safetensors"))
    with pytest.raises(SamoyedsError, match="use it with --config-only"):
        make_model("qwen3_moe", "tiny", tmp_path / "w", sparse=Pattern.parse("2:4"))
    assert not (tmp_path / "w").exists()
    # converted from an FP8 block-quantized checkpoint: its other layers' FP8 config, as the dense FP8 model's
    from_fp8 = make_model(
        "qwen3_moe", "tiny", tmp_path / "f", config_only=True, sparse=Pattern.parse("2:4"), fp8_block=True
    )
    quant = json.loads((from_fp8 / "config.json").read_text())["quantization_config"]
    dense_fp8 = make_model("qwen3_moe", "tiny", tmp_path / "d", config_only=True, fp8_block=True)
    assert quant["format_version"] == 3 and "values" not in quant
    assert quant["other_layers"] == json.loads((dense_fp8 / "config.json").read_text())["quantization_config"]


def test_layers_keeps_the_first_layers_of_a_real_shape(tmp_path):
    """--layers gives a real layer shape at a fraction of the size (the SparseGPT cost measurement uses it)."""
    out = make_model("qwen3_moe", "qwen3-30b-a3b", tmp_path / "m", config_only=True, layers=2)
    config = json.loads((out / "config.json").read_text())
    assert (
        config["num_hidden_layers"] == 2
        and config["hidden_size"] == load_preset("qwen3_moe", "qwen3-30b-a3b")["hidden_size"]
    )
    with pytest.raises(SamoyedsError, match="--layers must be between 1 and"):
        make_model("qwen3_moe", "qwen3-30b-a3b", tmp_path / "n", config_only=True, layers=0)


@pytest.mark.parametrize("fp8_block", [False, True])
def test_weights_bytes_is_what_make_model_writes(tmp_path, fp8_block):
    from samoyeds_vllm.tools.model_maker import weights_bytes

    out = make_model("qwen3_moe", "tiny", tmp_path / "m", fp8_block=fp8_block, dtype="bfloat16")
    config = json.loads((out / "config.json").read_text())
    written = sum(t.numel() * t.element_size() for t in read_checkpoint(out).values())
    assert weights_bytes(config) == written


def test_a_model_larger_than_the_free_space_is_refused(tmp_path, monkeypatch):
    """Mixtral-8x7B with random weights is ~87 GiB: refused before anything is written where it does not fit."""
    import shutil

    from samoyeds_vllm.tools import checkpoint_io

    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint_io.shutil, "disk_usage", lambda path: real(path)._replace(free=2**30))
    with pytest.raises(
        SamoyedsError, match=r"mixtral-8x7b with random weights needs about 8\d\.\d GiB in .*1\.0 GiB free"
    ):
        make_model("mixtral", "mixtral-8x7b", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_layers_that_keep_no_moe_layer_are_refused(tmp_path):
    """DeepSeek's first layers are dense MLPs (first_k_dense_replace): --layers 1 of the tiny preset, or 2 of the
    real one, made a model without routed experts, which convert then refused and fit sized as a sparse model."""
    with pytest.raises(SamoyedsError, match=r"--layers 1: .* no routed experts to make sparse; keep at least 2"):
        make_model("deepseek_v3", "tiny", tmp_path / "one", layers=1)
    with pytest.raises(SamoyedsError, match="keep at least 4"):
        make_model("deepseek_v3", "deepseek-v3", tmp_path / "two", layers=2, config_only=True)
    assert not list(tmp_path.iterdir())
    config = json.loads((make_model("deepseek_v3", "tiny", tmp_path / "ok", layers=2) / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 > config["first_k_dense_replace"]
