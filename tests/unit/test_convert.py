"""The converter on tiny models of every supported architecture, and every bad input it must refuse cleanly."""

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import dense_twin, fp8_experts_only, leftovers, read_checkpoint, rewrite_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from samoyeds_vllm.errors import CheckpointError, PatternError, SamoyedsError
from samoyeds_vllm.format import PackedWeight, Pattern, decompress, prune, satisfies
from samoyeds_vllm.tools import convert as convert_module
from samoyeds_vllm.tools.architectures import ARCHITECTURES
from samoyeds_vllm.tools.convert import REPORT_NAME, convert

SAMOYEDS = Pattern.parse("samoyeds")
TWO_FOUR = Pattern.parse("2:4")


def packed_of(tensors: dict, weight_name: str, pattern: Pattern) -> PackedWeight:
    prefix = weight_name.removesuffix(".weight")
    return PackedWeight(
        tensors[f"{prefix}.weight_packed"], tensors[f"{prefix}.weight_meta"], tensors.get(f"{prefix}.weight_rowsel")
    )


@pytest.mark.parametrize("pattern", [SAMOYEDS, TWO_FOUR], ids=str)
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_convert_every_architecture(tiny_models, tmp_path, arch, pattern):
    dense_dir, family = tiny_models[arch], ARCHITECTURES[arch]
    report = convert(dense_dir, tmp_path / "sparse", pattern, export_dense=tmp_path / "pruned", progress=False)
    dense, sparse, pruned = (
        read_checkpoint(dense_dir, family),
        read_checkpoint(tmp_path / "sparse"),
        read_checkpoint(tmp_path / "pruned", family),
    )
    expert_re = family.expert_weight_re

    experts = [n for n in dense if expert_re.match(n)]
    assert experts, "the tiny model has routed experts"
    for name, tensor in dense.items():
        if expert_re.match(name):
            assert name not in sparse
            assert satisfies(pruned[name], pattern)
            assert torch.equal(decompress(packed_of(sparse, name, pattern), pattern), pruned[name])
        else:  # everything else is copied unchanged into both outputs
            assert torch.equal(sparse[name], tensor) and torch.equal(pruned[name], tensor)
    assert set(pruned) == set(dense)
    assert set(read_checkpoint(tmp_path / "pruned")) == set(read_checkpoint(dense_dir))  # the hub's layout

    config = json.loads((tmp_path / "sparse" / "config.json").read_text())
    quant = config.pop("quantization_config")
    assert quant["quant_method"] == "samoyeds" and quant["format_version"] == 1
    assert (quant["pattern"], quant["segment"]) == (pattern.name, pattern.segment)
    assert quant["sparse_modules"] == ARCHITECTURES[arch].sparse_module_globs()
    assert config == json.loads((dense_dir / "config.json").read_text())
    for side_file in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "sparse" / side_file).read_bytes() == (dense_dir / side_file).read_bytes()

    # Random weights have no zeros: exactly the pattern's share is pruned, with a real reconstruction error.
    assert report.layers and all(s.sparsity == pytest.approx(1 - pattern.density) for s in report.layers.values())
    assert all(0.3 < s.relative_error < 1.0 for s in report.layers.values())
    assert json.loads((tmp_path / "sparse" / REPORT_NAME).read_text()) == report.to_json()
    assert report.sparse_bytes < report.dense_bytes * (pattern.density + 0.1)


def test_pruned_export_loads_and_generates_in_transformers(tiny_models, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    convert(tiny_models["mixtral"], tmp_path / "sparse", SAMOYEDS, export_dense=tmp_path / "pruned", progress=False)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "pruned")
    ids = tokenizer("The quick brown fox", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_checkpoint_on_the_pattern_converts_losslessly(tiny_models, tmp_path):
    """Converting the pruned export again gives the same packed tensors, and they decompress bit for bit."""
    convert(tiny_models["qwen3_moe"], tmp_path / "a", SAMOYEDS, export_dense=tmp_path / "pruned", progress=False)
    report = convert(tmp_path / "pruned", tmp_path / "b", SAMOYEDS, progress=False)
    first, second, pruned = (
        read_checkpoint(tmp_path / "a"),
        read_checkpoint(tmp_path / "b"),
        read_checkpoint(tmp_path / "pruned"),
    )
    assert first.keys() == second.keys()
    assert all(torch.equal(first[n], second[n]) for n in first)
    expert_re = ARCHITECTURES["qwen3_moe"].expert_weight_re
    for name in filter(expert_re.match, pruned):
        restored = decompress(packed_of(second, name, SAMOYEDS), SAMOYEDS)
        assert torch.equal(restored.view(torch.int32), pruned[name].view(torch.int32))
    assert all(s.relative_error == 0.0 for s in report.layers.values())


@pytest.mark.parametrize("segment", [32, 64])
def test_other_segments(tiny_models, tmp_path, segment):
    pattern = Pattern.parse("samoyeds", segment)
    convert(tiny_models["olmoe"], tmp_path / "s", pattern, progress=False)
    quant = json.loads((tmp_path / "s" / "config.json").read_text())["quantization_config"]
    assert quant["segment"] == segment
    tensors = read_checkpoint(tmp_path / "s")
    rowsel = next(t for n, t in tensors.items() if n.endswith("down_proj.weight_rowsel"))
    assert rowsel.shape[-1] == 256 // segment  # tiny olmoe's expert intermediate size is 256


def test_wanda_uses_calibration_activations(tiny_models, tmp_path):
    """Wanda keeps a pattern-valid set that differs from magnitude's, because activation norms differ."""
    from helpers import write_calibration_text

    from samoyeds_vllm.tools.calibration import Calibration

    convert(tiny_models["qwen2_moe"], tmp_path / "mag", TWO_FOUR, export_dense=tmp_path / "mag_d", progress=False)
    report = convert(
        tiny_models["qwen2_moe"],
        tmp_path / "wanda",
        TWO_FOUR,
        "wanda",
        export_dense=tmp_path / "wanda_d",
        calibration=Calibration(str(write_calibration_text(tmp_path / "text")), samples=4, seq_len=64),
        progress=False,
    )
    assert report.method == "wanda"
    quant = json.loads((tmp_path / "wanda" / "config.json").read_text())["quantization_config"]
    assert quant["pruning_method"] == "wanda"
    mag, wanda = read_checkpoint(tmp_path / "mag_d"), read_checkpoint(tmp_path / "wanda_d")
    expert_re = ARCHITECTURES["qwen2_moe"].expert_weight_re
    experts = [n for n in mag if expert_re.match(n)]
    assert all(satisfies(wanda[n], TWO_FOUR) for n in experts)
    changed = sum(not torch.equal(mag[n] != 0, wanda[n] != 0) for n in experts)
    assert changed > len(experts) // 2
    # Wanda trades weight magnitude for activation-weighted importance: its plain weight error is larger.
    assert all(report.layers[i].relative_error > 0.3 for i in report.layers)


# ------------------------------------------------------------------------------------------ bad inputs


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def expect_refusal(in_dir: Path, out_dir: Path, error: type, words: str, **kwargs) -> None:
    with pytest.raises(error, match=words):
        convert(in_dir, out_dir, kwargs.pop("pattern", SAMOYEDS), progress=False, **kwargs)
    assert not out_dir.exists()
    assert leftovers(out_dir.parent) == []


def test_missing_and_unreadable_input(tmp_path, monkeypatch):
    expect_refusal(tmp_path / "nope", tmp_path / "out", CheckpointError, "no such directory$")
    monkeypatch.chdir(tmp_path)  # a hub name, which vLLM would download, is pointed at the download
    hint = r"Qwen/Qwen3-30B-A3B: no such directory \(a Hugging Face model\? download it first: hf download Qwen/"
    expect_refusal(Path("Qwen/Qwen3-30B-A3B"), tmp_path / "out", CheckpointError, hint)
    (tmp_path / "file").write_text("x")
    expect_refusal(tmp_path / "file", tmp_path / "out", CheckpointError, "not a directory")
    (tmp_path / "empty").mkdir()
    expect_refusal(tmp_path / "empty", tmp_path / "out", CheckpointError, "no config.json")
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    expect_refusal(tmp_path / "badjson", tmp_path / "out", CheckpointError, "not valid JSON")


def test_kimi_k2_converts_as_deepseek_v3_and_its_dense_parts_stay(tiny_models, tmp_path):
    """Kimi-K2 checkpoints say model_type kimi_k2 over DeepSeek-V3's tensors. The leading dense layer, the shared
    experts and the router's score-correction bias are copied as they are."""
    kimi = copy_model(tiny_models["deepseek_v3"], tmp_path / "kimi")
    config = json.loads((kimi / "config.json").read_text())
    (kimi / "config.json").write_text(json.dumps(dict(config, model_type="kimi_k2")))
    convert(kimi, tmp_path / "kimi-sparse", TWO_FOUR, progress=False)
    convert(tiny_models["deepseek_v3"], tmp_path / "v3-sparse", TWO_FOUR, progress=False)
    sparse, v3, dense = map(read_checkpoint, (tmp_path / "kimi-sparse", tmp_path / "v3-sparse", kimi))
    assert sparse.keys() == v3.keys() and all(torch.equal(t, v3[name]) for name, t in sparse.items())
    assert json.loads((tmp_path / "kimi-sparse" / "config.json").read_text())["model_type"] == "kimi_k2"

    kept = [
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.shared_experts.up_proj.weight",
        "model.layers.2.mlp.gate.e_score_correction_bias",
    ]
    assert all(torch.equal(sparse[name], dense[name]) for name in kept)
    assert "model.layers.2.mlp.experts.0.up_proj.weight_packed" in sparse
    assert not any(name.startswith("model.layers.0.mlp.experts.") for name in sparse)


def test_multimodal_llama4_converts_only_its_language_models_experts(tiny_models, tmp_path):
    """Llama4ForConditionalGeneration holds Llama-4's language model under language_model. (the tiny one the tiny
    text model's, same seed) beside a vision tower and projector: its routed experts are packed as the text
    model's are, under the prefix, and everything else (vision, projector, shared experts, dense layers, routers) is
    copied as it is."""
    multimodal, text = ARCHITECTURES["llama4"], ARCHITECTURES["llama4_text"]
    expert = "model.layers.1.feed_forward.experts.3.up_proj.weight"
    assert multimodal.expert_weight_re.match(f"language_model.{expert}") and not multimodal.expert_weight_re.match(
        expert
    )
    assert text.expert_weight_re.match(expert) and not text.expert_weight_re.match(f"language_model.{expert}")

    convert(tiny_models["llama4"], tmp_path / "mm", SAMOYEDS, progress=False)
    convert(tiny_models["llama4_text"], tmp_path / "text", SAMOYEDS, progress=False)
    sparse, text_sparse = read_checkpoint(tmp_path / "mm"), read_checkpoint(tmp_path / "text")
    dense = read_checkpoint(tiny_models["llama4"])
    language = {n.removeprefix("language_model."): t for n, t in sparse.items() if n.startswith("language_model.")}
    assert language.keys() == text_sparse.keys() and all(torch.equal(t, text_sparse[n]) for n, t in language.items())
    assert "language_model.model.layers.1.feed_forward.experts.7.down_proj.weight_packed" in sparse
    assert not any(name.endswith(("experts.gate_up_proj", "experts.down_proj")) for name in sparse)
    kept = [name for name in dense if not name.startswith("language_model.")]
    kept += [
        "language_model.model.layers.0.feed_forward.gate_proj.weight",
        "language_model.model.layers.1.feed_forward.shared_expert.down_proj.weight",
        "language_model.model.layers.1.feed_forward.router.weight",
    ]
    assert any(name.startswith("vision_model.") for name in kept) and "multi_modal_projector.linear_1.weight" in kept
    assert all(torch.equal(sparse[name], dense[name]) for name in kept)

    # vLLM reads the top level's quantization_config first; the text model's config stays as it was
    config = json.loads((tmp_path / "mm" / "config.json").read_text())
    assert config.pop("quantization_config")["sparse_modules"] == [
        f"language_model.model.layers.*.feed_forward.experts.*.{proj}" for proj in ("gate_proj", "up_proj", "down_proj")
    ]
    assert config == json.loads((tiny_models["llama4"] / "config.json").read_text())


def test_unsupported_architecture(tiny_models, tmp_path):
    model = copy_model(tiny_models["qwen3_moe"], tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, model_type="llama")))
    expect_refusal(model, tmp_path / "out", CheckpointError, "'llama' is not a supported MoE architecture")


def test_already_converted_and_quantized(tiny_models, tmp_path):
    convert(tiny_models["mixtral"], tmp_path / "sparse", SAMOYEDS, progress=False)
    expect_refusal(tmp_path / "sparse", tmp_path / "again", CheckpointError, "already a samoyeds sparse checkpoint")
    model = copy_model(tiny_models["mixtral"], tmp_path / "fp8")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, quantization_config={"quant_method": "awq"})))
    expect_refusal(model, tmp_path / "out", CheckpointError, "quantized with 'awq'")


def test_fp8_values_and_fp8_block_input(tmp_path):
    """--values fp8 writes format version 2 (values, scales, the quantization error in the report); an FP8
    block-quantized input prunes and packs its experts exactly as the dense checkpoint it stands for, and keeps its
    other FP8 weights as stored (format version 3, the input's FP8 config in other_layers)."""
    from samoyeds_vllm.format import FP8
    from samoyeds_vllm.tools.model_maker import make_model

    block = make_model("qwen3_moe", "tiny", tmp_path / "block", fp8_block=True, dtype="bfloat16")
    block_config = json.loads((block / "config.json").read_text())
    assert block_config["quantization_config"]["weight_block_size"] == [128, 128]
    tensors = read_checkpoint(block)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].dtype == FP8
    assert tensors["model.layers.0.mlp.gate.weight"].dtype == torch.bfloat16  # routers stay unquantized
    dense = dense_twin(block, tmp_path / "dense")  # every FP8 tensor dequantized

    report = convert(
        block, tmp_path / "from-block", SAMOYEDS, values=FP8, export_dense=tmp_path / "block-pruned", progress=False
    )
    convert(dense, tmp_path / "from-dense", SAMOYEDS, values=FP8, export_dense=tmp_path / "pruned", progress=False)
    a, b = read_checkpoint(tmp_path / "from-block"), read_checkpoint(tmp_path / "from-dense")
    experts = {k for k in b if ".experts." in k}
    assert experts and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in experts)
    # the other layers: the FP8 input's tensors, bit for bit, scales included; in the dense export dequantized
    others = {k for k in tensors if ".experts." not in k}
    assert a.keys() == experts | others
    assert all(torch.equal(a[k].view(torch.uint8), tensors[k].view(torch.uint8)) for k in others)
    assert any(a[k].dtype == FP8 for k in others) and any(k.endswith("_scale_inv") for k in others)
    exported, pruned = read_checkpoint(tmp_path / "block-pruned"), read_checkpoint(tmp_path / "pruned")
    assert exported.keys() == pruned.keys() and all(torch.equal(exported[k], pruned[k]) for k in pruned)
    quant = json.loads((tmp_path / "from-block" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 3 and quant["values"] == "float8_e4m3fn" and quant["scale"] == "channel"
    assert quant["other_layers"] == json.loads((block / "config.json").read_text())["quantization_config"]
    quant = json.loads((tmp_path / "from-dense" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 2 and "other_layers" not in quant
    # asked to, the other layers are written dequantized: the dense twin's conversion, bit for bit (version 2)
    convert(block, tmp_path / "dequantized", SAMOYEDS, values=FP8, dequantize_other_layers=True, progress=False)
    c = read_checkpoint(tmp_path / "dequantized")
    assert c.keys() == b.keys() and all(torch.equal(c[k].view(torch.uint8), b[k].view(torch.uint8)) for k in b)
    quant = json.loads((tmp_path / "dequantized" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 2 and "other_layers" not in quant
    with pytest.raises(SamoyedsError, match="is not FP8 block-quantized: there are no FP8 layers to dequantize"):
        convert(dense, tmp_path / "nothing-to-dequantize", SAMOYEDS, dequantize_other_layers=True, progress=False)
    # an FP8 input whose other layers are all unquantized converts as a bf16 one does (version 2)
    experts_only = rewrite_checkpoint(block, tmp_path / "experts-only", fp8_experts_only)
    convert(experts_only, tmp_path / "from-experts-only", SAMOYEDS, values=FP8, progress=False)
    quant = json.loads((tmp_path / "from-experts-only" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 2 and "other_layers" not in quant
    assert a["model.layers.0.mlp.experts.1.up_proj.weight_packed"].dtype == FP8
    assert a["model.layers.0.mlp.experts.1.up_proj.weight_scale"].dtype == torch.float32
    errors = [s.quantization_error for s in report.layers.values()]
    assert all(0.01 < e < 0.04 for e in errors) and "quant. error" in report.table()


def test_truncated_and_corrupted_safetensors(tiny_models, tmp_path):
    model = copy_model(tiny_models["olmoe"], tmp_path / "truncated")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    expect_refusal(model, tmp_path / "out", CheckpointError, "corrupted or truncated safetensors")
    weights.write_bytes(b"\xff" * 64 + data[64:])  # garbage header
    expect_refusal(model, tmp_path / "out", CheckpointError, "corrupted or truncated safetensors")
    weights.unlink()
    expect_refusal(model, tmp_path / "out", CheckpointError, "no \\*.safetensors weights")


def test_index_naming_a_missing_shard(tiny_models, tmp_path):
    model = copy_model(tiny_models["olmoe"], tmp_path / "m")
    names = list(load_file(model / "model.safetensors"))
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_refusal(model, tmp_path / "out", CheckpointError, "model-00002-of-00002.safetensors: listed in")


def test_expert_shape_that_does_not_fit(tiny_models, tmp_path):
    """Experts of 96 intermediate rows, as config.json says: the down projection's 96 inputs are no whole segments."""
    model = copy_model(tiny_models["qwen3_moe"], tmp_path / "m")
    tensors = load_file(model / "model.safetensors")
    for name in [n for n in tensors if ".experts." in n]:
        tensors[name] = (tensors[name][:, :96] if "down_proj" in name else tensors[name][:96]).contiguous()
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"moe_intermediate_size": 96}))
    expect_refusal(
        model,
        tmp_path / "out",
        PatternError,
        r"model.layers.0.mlp.experts.0.down_proj.weight: shape .* in_features 96 is not a multiple of the segment size",
    )


def test_checkpoint_that_disagrees_with_its_config_is_refused(tiny_models, tmp_path):
    """A tensor missing, one of another shape, or a config of more layers than the weights: vLLM would serve such a
    converted checkpoint as noise (it checks for weights it did not load only without a quantization method)."""
    model = copy_model(tiny_models["qwen3_moe"], tmp_path / "m")
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.1.mlp.experts.2.down_proj.weight"
    save_file(tensors | {name: tensors[name][:, :96].contiguous()}, model / "model.safetensors")
    expect_refusal(model, tmp_path / "out", CheckpointError, rf"{name} is \[128, 96\] in the checkpoint but config")
    for missing in ["model.layers.0.mlp.gate.weight", "model.embed_tokens.weight"]:
        save_file({k: v for k, v in tensors.items() if k != missing}, model / "model.safetensors")
        lacks = rf"implies 1 tensor\(s\) the checkpoint lacks \({missing}\)"
        expect_refusal(model, tmp_path / "out", CheckpointError, lacks)
    save_file(tensors, model / "model.safetensors")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"num_hidden_layers": config["num_hidden_layers"] + 1}))
    expect_refusal(model, tmp_path / "out", CheckpointError, "checkpoint is incomplete or config.json is not its own")


def test_fused_experts_of_a_wrong_shape_are_refused(tiny_models, tmp_path):
    """Llama-4's fused expert tensors must be [experts, in, out]; anything else is refused before writing."""
    model = copy_model(tiny_models["llama4_text"], tmp_path / "m")
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.1.feed_forward.experts.gate_up_proj"
    tensors[name] = tensors[name][0]
    save_file(tensors, model / "model.safetensors")
    expect_refusal(model, tmp_path / "out", CheckpointError, rf"{name} is \[128, 256\] in the checkpoint but config")


def test_existing_output_needs_force(tiny_models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SamoyedsError, match="already exists.*--force"):
        convert(tiny_models["olmoe"], out, SAMOYEDS, progress=False)
    with pytest.raises(SamoyedsError, match="does not look like a model; not replacing it"):
        convert(tiny_models["olmoe"], out, SAMOYEDS, force=True, progress=False)
    # From a fourth walk: a folder made beforehand, still empty, is taken without --force; an output under a file
    # failed at the end with a FileExistsError traceback
    empty = tmp_path / "made-beforehand"
    empty.mkdir()
    convert(tiny_models["olmoe"], empty, SAMOYEDS, progress=False)
    assert (empty / "config.json").is_file() and leftovers(tmp_path) == []
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SamoyedsError, match=r"a-file/sub: .*a-file is a file, not a folder"):
        convert(tiny_models["olmoe"], tmp_path / "a-file" / "sub", SAMOYEDS, progress=False)
    assert (out / "keep.txt").read_text() == "mine"
    (out / "config.json").write_text("{}")  # an earlier model: --force replaces it
    convert(tiny_models["olmoe"], out, SAMOYEDS, force=True, progress=False)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert leftovers(tmp_path) == []
    with pytest.raises(SamoyedsError, match="is the input directory"):
        convert(tiny_models["olmoe"], tiny_models["olmoe"], SAMOYEDS, force=True, progress=False)


def test_failure_midway_leaves_nothing(tiny_models, tmp_path, monkeypatch):
    """A run that dies after writing some tensors leaves neither OUT_DIR, the dense export, nor temp dirs."""
    calls = {"n": 0}
    real_compress = convert_module.compress

    def failing_compress(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 20:
            raise KeyboardInterrupt
        return real_compress(*args, **kwargs)

    monkeypatch.setattr(convert_module, "compress", failing_compress)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_models["mixtral"], tmp_path / "out", SAMOYEDS, export_dense=tmp_path / "d", progress=False)
    assert calls["n"] == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_sharded_input_and_output(tiny_models, tmp_path):
    """Multi-shard checkpoints convert; a small shard limit splits the output with a complete index."""
    convert(tiny_models["qwen3_moe"], tmp_path / "sharded", SAMOYEDS, max_shard_bytes=1 << 20, progress=False)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1
    for f in files:
        with safe_open(tmp_path / "sharded" / f, "pt") as h:
            assert all(index["weight_map"][k] == f for k in h.keys())
    # The sharded sparse checkpoint reads back like the single-file one.
    convert(tiny_models["qwen3_moe"], tmp_path / "single", SAMOYEDS, progress=False)
    sharded, single = read_checkpoint(tmp_path / "sharded"), read_checkpoint(tmp_path / "single")
    assert sharded.keys() == single.keys() and all(torch.equal(sharded[k], single[k]) for k in single)


def test_cli_reports_errors_without_traceback(tiny_models, tmp_path):
    cli = [sys.executable, "-m", "samoyeds_vllm.cli", "convert"]
    bad = subprocess.run(
        cli + [str(tmp_path / "missing"), str(tmp_path / "out"), "--pattern", "2:4"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "error:" in bad.stderr and "no such directory" in bad.stderr and "Traceback" not in bad.stderr
    olmoe = [str(tiny_models["olmoe"]), str(tmp_path / "out"), "--pattern", "samoyeds", "--segment", "64"]
    bad = subprocess.run(cli + olmoe + ["--dequantize-other-layers"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no FP8 layers to dequantize" in bad.stderr and "Traceback" not in bad.stderr
    for device, words in [("banana", "not a device; give cpu, cuda or cuda:N"), ("cuda:7", "CUDA GPU")]:
        bad = subprocess.run(cli + olmoe + ["--device", device], capture_output=True, text=True)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    bad = subprocess.run(cli + olmoe + ["--calib-samples", "4", "--seed", "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr  # magnitude ran and ignored them
    assert "--calib-samples, --seed: calibration settings, which apply with --calib-data" in bad.stderr
    ok = subprocess.run(cli + olmoe, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "sparsity" in ok.stdout and "75.00%" in ok.stdout
    assert "converting" in ok.stderr  # the progress bar


def test_a_second_run_into_the_same_output_is_refused(tiny_models, tmp_path):
    """Two conversions into one OUT at once: the second is refused while the first holds the output's lock."""
    import fcntl
    import os

    out = tmp_path / "out"
    fd = os.open(tmp_path / ".out.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a running conversion into `out` holds it
    try:
        with pytest.raises(SamoyedsError, match="another process is writing"):
            convert(tiny_models["qwen3_moe"], out, TWO_FOUR, progress=False)
    finally:
        os.close(fd)
    assert not out.exists() and leftovers(tmp_path) == []
    convert(tiny_models["qwen3_moe"], out, TWO_FOUR, progress=False)  # free again
    assert (out / "config.json").is_file()


def test_an_output_that_appears_meanwhile_is_not_replaced(tmp_path):
    from samoyeds_vllm.tools.checkpoint_io import staged_dirs

    target = tmp_path / "out"
    with pytest.raises(SamoyedsError, match="appeared while this run was writing"):
        with staged_dirs(target) as (work,):
            (work / "x").write_text("new")
            target.mkdir()
            (target / "keep").write_text("someone else's")
    assert (target / "keep").read_text() == "someone else's" and leftovers(tmp_path) == []


def test_stale_partial_outputs_are_removed(tiny_models, tmp_path, capsys):
    stale = tmp_path / ".out.partial-abc123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half written")
    convert(tiny_models["qwen3_moe"], tmp_path / "out", TWO_FOUR, progress=False)
    assert not stale.exists() and leftovers(tmp_path) == []
    assert "left by an earlier run" in capsys.readouterr().err
    # the output as open() and mkdir() would make it, not tempfile's private 0700 folder
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o777 & ~umask


def test_a_run_stopped_while_replacing_its_output_gives_the_previous_one_back(tiny_models, tmp_path, capsys):
    """Killed between moving the previous output aside and moving its own into place: the next run puts the
    previous output back before it starts (and then replaces it only with --force)."""
    previous = tmp_path / ".out.replaced-abc123"
    shutil.copytree(tiny_models["qwen3_moe"], previous)
    (tmp_path / ".out.partial-abc123").mkdir()
    with pytest.raises(SamoyedsError, match="already exists"):
        convert(tiny_models["qwen3_moe"], tmp_path / "out", TWO_FOUR, progress=False)
    assert "restored" in capsys.readouterr().err
    assert (tmp_path / "out" / "config.json").is_file() and leftovers(tmp_path) == []


def test_output_inside_the_input_is_refused(tiny_models, tmp_path):
    model = copy_model(tiny_models["qwen3_moe"], tmp_path / "dense")
    with pytest.raises(SamoyedsError, match="inside the input directory"):
        convert(model, model / "sub", TWO_FOUR, progress=False)
    assert not (model / "sub").exists()


def test_output_holding_the_input_is_refused(tiny_models, tmp_path):
    """--force into a folder above the input would delete the input with the folder."""
    parent = tmp_path / "parent"
    model = copy_model(tiny_models["qwen3_moe"], parent / "dense")
    shutil.copy(model / "config.json", parent / "config.json")  # looks like a model: --force alone would replace it
    (parent / "notes.txt").write_text("mine")
    with pytest.raises(SamoyedsError, match="holds the input directory"):
        convert(model, parent, TWO_FOUR, force=True, progress=False)
    with pytest.raises(SamoyedsError, match="holds the input directory"):
        convert(model, tmp_path / "out", TWO_FOUR, export_dense=tmp_path, force=True, progress=False)
    assert (parent / "notes.txt").read_text() == "mine" and (model / "config.json").is_file()


def test_nonfinite_weights_are_refused_unless_allowed(tiny_models, tmp_path):
    model = copy_model(tiny_models["olmoe"], tmp_path / "dense")
    path = next(model.glob("*.safetensors"))
    tensors = load_file(path)
    name = next(n for n in tensors if n.endswith("experts.1.up_proj.weight"))
    tensors[name][0, 3] = float("nan")
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"{name} holds 1 non-finite"):
        convert(model, tmp_path / "out", TWO_FOUR, progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    convert(model, tmp_path / "out", TWO_FOUR, allow_nonfinite=True, progress=False)


def test_fp8_block_input_with_fused_experts(tmp_path):
    """Llama-4's layout (every layer's experts fused in one gate_up and one down tensor, dense layers between), its
    other linears FP8 block-quantized (the fused experts, named without `.weight`, stay in the model's dtype as
    make-model writes them): the experts are pruned and packed as its dequantized twin's, the other FP8 weights kept
    as stored (format version 3)."""
    from samoyeds_vllm.tools.model_maker import make_model

    block = make_model("llama4_text", "tiny", tmp_path / "block", fp8_block=True, dtype="bfloat16")
    tensors = read_checkpoint(block)
    fused = {k for k in tensors if ".experts." in k}
    assert fused and all(tensors[k].dtype == torch.bfloat16 for k in fused)
    config = json.loads((block / "config.json").read_text())
    dense = dense_twin(block, tmp_path / "dense")

    convert(block, tmp_path / "from-block", SAMOYEDS, progress=False)
    convert(dense, tmp_path / "from-dense", SAMOYEDS, progress=False)
    a, b = read_checkpoint(tmp_path / "from-block"), read_checkpoint(tmp_path / "from-dense")
    experts = {k for k in b if ".experts." in k}
    assert experts and all(torch.equal(a[k], b[k]) for k in experts)
    others = {k for k in tensors if ".experts." not in k}
    assert a.keys() == experts | others
    assert all(torch.equal(a[k].view(torch.uint8), tensors[k].view(torch.uint8)) for k in others)
    assert any(a[k].dtype == torch.float8_e4m3fn for k in others)
    quant = json.loads((tmp_path / "from-block" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 3 and quant["other_layers"] == config["quantization_config"]


def tensor_bytes(model_dir: Path) -> int:
    """Bytes of every tensor of a checkpoint (its safetensors files without their headers)."""
    return sum(t.numel() * t.element_size() for t in read_checkpoint(model_dir).values())


def estimate(in_dir: Path, pattern: Pattern, values, keep_fp8: bool = True) -> tuple[int, int]:
    config, arch, reader, fp8_reader = convert_module._check_input(in_dir)
    return convert_module._output_bytes(reader, fp8_reader, arch.expert_weight_re, pattern, values, keep_fp8)


def bf16_experts(tensors, config):
    """Experts stored in bfloat16 beside float32 tensors, under a config that says float32."""
    for name in [n for n in tensors if ".experts." in n]:
        tensors[name] = tensors[name].to(torch.bfloat16)


@pytest.mark.parametrize("arch", ["qwen3_moe", "llama4_text", "bf16-experts"])
@pytest.mark.parametrize("pattern, values", [(SAMOYEDS, None), (TWO_FOUR, None), (SAMOYEDS, "fp8")])
def test_the_free_space_estimate_is_what_convert_writes(tiny_models, tmp_path, arch, pattern, values):
    """The estimate the free-space check uses is the bytes convert then writes, for the sparse checkpoint and the
    dense export alike: with fused experts (Llama-4), and with tensors stored in another dtype than config.json's."""
    from samoyeds_vllm.format import FP8

    values = FP8 if values else None
    if arch == "bf16-experts":
        in_dir = rewrite_checkpoint(tiny_models["qwen3_moe"], tmp_path / "in", bf16_experts)
    else:
        in_dir = tiny_models[arch]
    sparse, dense = estimate(in_dir, pattern, values)
    convert(in_dir, tmp_path / "out", pattern, values=values, export_dense=tmp_path / "dense", progress=False)
    assert sparse == tensor_bytes(tmp_path / "out")
    assert dense == tensor_bytes(tmp_path / "dense")


def test_fp8_block_input_estimate_counts_its_fp8_layers_as_stored(tmp_path):
    from samoyeds_vllm.format import FP8
    from samoyeds_vllm.tools.model_maker import make_model

    block = make_model("qwen3_moe", "tiny", tmp_path / "block", fp8_block=True, dtype="bfloat16")
    for keep in (True, False):
        out = tmp_path / f"out-{keep}"
        convert(block, out, SAMOYEDS, values=FP8, dequantize_other_layers=not keep, progress=False)
        assert estimate(block, SAMOYEDS, FP8, keep)[0] == tensor_bytes(out)


def test_too_little_free_space_is_refused_before_writing(tiny_models, tmp_path, monkeypatch):
    """Refused where the output does not fit; the partial output a killed run left beside it counts as free, since
    the run removes it before writing."""
    from samoyeds_vllm.tools import checkpoint_io

    in_dir = tiny_models["qwen3_moe"]
    needed = estimate(in_dir, SAMOYEDS, None)[0]
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint_io.shutil, "disk_usage", lambda path: real(path)._replace(free=needed // 2))
    expect_refusal(in_dir, tmp_path / "out", SamoyedsError, r"the output needs about .* GiB free")
    stale = tmp_path / ".out.partial-abc123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(bytes(needed))
    convert(in_dir, tmp_path / "out", SAMOYEDS, progress=False)
    assert not stale.exists()


def test_report_explains_sparsity_above_the_pattern():
    """A kept weight can be zero (calibrated methods zero the weights of inputs the text never reached): the table
    says so where a layer's sparsity passes the pattern's."""
    pattern = Pattern.parse("samoyeds")
    w = prune(torch.randn(64, 256), pattern)
    report = convert_module.ConversionReport(pattern, "sparsegpt")
    report.layers[0] = convert_module.LayerStats()
    report.layers[0].add(w, w)
    assert "above the pattern" not in report.table()
    dead = w.clone()
    dead[:, :128] = 0.0  # the first segment's inputs dead: half of the kept weights zero
    report.layers[1] = convert_module.LayerStats()
    report.layers[1].add(w, dead)
    assert report.layers[1].sparsity == pytest.approx(0.875)
    assert "sparsity above the pattern's 75%: kept weights that are zero" in report.table()
