"""tools/memory.py and `samoyeds-vllm fit`: the bytes counted are those the format's code writes, and the counts
agree with what vLLM's engine logged on an H100 (the bench e2e results kept under benchmarks/results/)."""

import json
import re
from pathlib import Path

import pytest
import torch

from samoyeds_vllm.cli import main
from samoyeds_vllm.format import Pattern, compress, prune, quantize
from samoyeds_vllm.format.fp8_blocks import quantized_bytes
from samoyeds_vllm.tools.fp8_blocks import quantize_blocks
from samoyeds_vllm.tools.memory import (
    FORMS,
    GIB,
    GPU_BYTES,
    kv_bytes_per_token,
    plan,
    weight_bytes,
)
from samoyeds_vllm.tools.model_maker import ModelForm, make_model
from samoyeds_vllm.tools.presets import load_preset

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"
#: Engine logs of the Qwen3-30B-A3B shape on an H100 at --gpu-memory-utilization 0.9, by form.
MEASURED = {
    "dense": RESULTS / "e2e-quick-h100" / "variant-dense.json",
    "dense-fp8": RESULTS / "e2e-fp8-h100" / "serving-dense-fp8" / "variant-dense-fp8.json",
    "samoyeds": RESULTS / "e2e-quick-h100" / "variant-samoyeds.json",
    "samoyeds-fp8": RESULTS / "e2e-quick-h100" / "variant-samoyeds-fp8.json",
}
QWEN3 = load_preset("qwen3_moe", "qwen3-30b-a3b")


@pytest.mark.parametrize("pattern", ["samoyeds", "2:4"])
@pytest.mark.parametrize("fp8", [False, True])
def test_packed_bytes_are_those_compress_writes(pattern, fp8):
    pattern = Pattern.parse(pattern)
    w = prune(torch.randn(96, 256, dtype=torch.bfloat16), pattern)
    packed = compress(w, pattern)
    if fp8:
        packed = quantize(packed, pattern)
    written = sum(t.nbytes for t in packed if t is not None)
    assert pattern.packed_bytes((96, 256), 1 if fp8 else 2, scaled=fp8) == written


def test_fp8_block_bytes_are_those_quantize_blocks_writes():
    for block in [(128, 128), (64, 32)]:
        q, scale_inv = quantize_blocks(torch.randn(200, 300), block)
        assert quantized_bytes((200, 300), block) == q.nbytes + scale_inv.nbytes


@pytest.mark.parametrize("form", MEASURED)
def test_weights_and_kv_cache_agree_with_vllm_on_an_h100(form):
    record = json.loads(MEASURED[form].read_text())
    memory, settings = record["memory"], record["settings"]
    assert settings["preset"] == "qwen3-30b-a3b"
    assert settings["engine_args"][-2:] == ["--gpu-memory-utilization", "0.9"]
    mib = int(re.search(r"(\d+) MiB", settings["device"])[1])
    assert mib * 2**20 == GPU_BYTES["h100"]
    assert weight_bytes(QWEN3, FORMS[form]) / GIB == pytest.approx(memory["weights_gib"], rel=0.01)
    logged_per_token = memory["kv_cache_gib"] * GIB / memory["kv_cache_tokens"]  # GiB rounded to 0.01
    assert kv_bytes_per_token(QWEN3) == pytest.approx(logged_per_token, rel=0.001)
    # what vLLM kept beside weights and KV cache: the default overhead stands for it
    overhead = 0.9 * GPU_BYTES["h100"] / GIB - memory["weights_gib"] - memory["kv_cache_gib"]
    assert 3.0 < overhead < 4.5
    (fit,) = plan(QWEN3, [form], GPU_BYTES["h100"])
    assert fit.kv_tokens == pytest.approx(memory["kv_cache_tokens"], rel=0.03)


@pytest.mark.parametrize("form, tp", [("samoyeds-fp8", 1), ("dense-fp8", 2)])
def test_a_big_model_on_one_h200_and_dense_over_two_agree_with_vllm(form, tp):
    """Qwen3-235B-A22B: samoyeds FP8 on one H200, dense FP8 over two (bench e2e --dense-tp 2)."""
    record = json.loads((RESULTS / "e2e-qwen3-235b-h200x2" / f"variant-{form}.json").read_text())
    (engine,), settings = record["offline_engines"].values(), record["settings"]
    assert settings.get("gpus", 1) == tp and "--gpu-memory-utilization 0.9" in " ".join(settings["engine_args"])
    assert int(re.search(r"(\d+) MiB", settings["device"])[1]) * 2**20 == GPU_BYTES["h200"]
    config = load_preset("qwen3_moe", "qwen3-235b-a22b")
    (fit,) = plan(config, [form], GPU_BYTES["h200"], tp)
    assert fit.weights_gib == pytest.approx(engine["weights_gib"], rel=0.01)
    assert fit.kv_tokens == pytest.approx(engine["kv_cache_tokens"], rel=0.03)


def test_a_form_converted_from_fp8_counts_its_other_projections_in_fp8():
    from_fp8 = ModelForm("samoyeds", fp8=True, from_fp8=True)  # bench e2e's samoyeds-fp8-from-fp8
    assert weight_bytes(QWEN3, from_fp8) == weight_bytes(QWEN3, FORMS["samoyeds-fp8"], from_fp8=True)
    assert weight_bytes(QWEN3, from_fp8) < weight_bytes(QWEN3, FORMS["samoyeds-fp8"])
    with pytest.raises(ValueError, match="packed checkpoint"):
        ModelForm(fp8=True, from_fp8=True)
    # as vLLM loaded it on an H100 (bench e2e, 2026-12-07)
    record = json.loads((RESULTS / "e2e-from-fp8-h100" / "variant-samoyeds-fp8-from-fp8.json").read_text())
    loaded = record["offline_engines"]["4096x64"]["weights_gib"]
    assert weight_bytes(QWEN3, from_fp8) / GIB == pytest.approx(loaded, rel=0.01)


def test_tensor_parallel_shares_and_mla():
    one, two = (weight_bytes(QWEN3, FORMS["samoyeds-fp8"], tp) for tp in (1, 2))
    assert one / 2 < two < one / 2 * 1.005  # norms and routers (replicated) are a sliver
    assert kv_bytes_per_token(QWEN3, tp=2) == kv_bytes_per_token(QWEN3) // 2  # 4 key/value heads, 2 per GPU
    assert kv_bytes_per_token(QWEN3, tp=8) == kv_bytes_per_token(QWEN3) // 4  # one head on each of 8
    # a config whose only tensors are the attention projections of one layer: what each GPU holds of them
    c = QWEN3
    q, kv = 2 * c["hidden_size"] * 32 * 128, 2 * c["hidden_size"] * 4 * 128  # bf16 bytes of q_proj, of k_proj
    attention = 2 * q + 2 * kv  # q_proj, o_proj, k_proj, v_proj
    one_layer = dict(c, num_hidden_layers=1)
    no_attention = weight_bytes(one_layer, FORMS["dense"], 8) - (2 * q + 2 * kv / 4) / 8
    assert weight_bytes(one_layer, FORMS["dense"], 1) - attention == pytest.approx(no_attention * 8, rel=0.01)
    v3 = load_preset("deepseek_v3", "deepseek-v3")
    assert kv_bytes_per_token(v3) == kv_bytes_per_token(v3, tp=8) == 61 * (512 + 64) * 2  # the latent, whole
    v3_one = dict(v3, num_hidden_layers=1, first_k_dense_replace=1)  # one dense layer: MLA and a dense MLP
    low_rank = 2 * v3["hidden_size"] * (v3["q_lora_rank"] + v3["kv_lora_rank"] + v3["qk_rope_head_dim"])
    sharded = weight_bytes(v3_one, FORMS["dense"], 1) - low_rank
    assert weight_bytes(v3_one, FORMS["dense"], 8) == pytest.approx(low_rank + sharded / 8, rel=0.001)


def test_tensor_parallel_sizes_vllm_or_the_method_refuse():
    fits = {f.name: f for f in plan(QWEN3, ["dense", "dense-fp8", "samoyeds", "2of4"], GPU_BYTES["h100"], tp=8)}
    assert fits["dense"].weights_gib is not None and fits["2of4"].weights_gib is not None
    assert "segment" in fits["samoyeds"].reason and "TP = 8" in fits["samoyeds"].reason  # 96-wide shards
    assert "scale blocks" in fits["dense-fp8"].reason
    (fit,) = plan(QWEN3, ["dense"], GPU_BYTES["h100"], tp=3)
    assert "32 attention heads do not divide among 3 GPUs" in fit.reason


def test_a_pattern_the_experts_do_not_take_is_named():
    config = dict(QWEN3, moe_intermediate_size=96)  # the down projection's 96 inputs: no whole segment of 128
    fits = {f.name: f for f in plan(config, ["samoyeds", "2of4"], GPU_BYTES["h100"])}
    assert fits["samoyeds"].weights_gib is None and "segment" in fits["samoyeds"].reason
    assert fits["2of4"].weights_gib is not None


def test_fit_prints_each_form_and_refuses_bad_input(tmp_path, capsys):
    assert main(["fit", "qwen3-235b-a22b", "--gpu", "h200"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[3:]}
    assert list(rows) == list(FORMS)
    assert "does not fit" in rows["dense-fp8"] and "does not fit" not in rows["samoyeds-fp8"]
    assert rows["samoyeds-fp8"].endswith("x")  # a concurrency, as vLLM's "Maximum concurrency" says it
    assert rows["dense-fp8"].split()[-3:] == ["(97.85", "GiB", "short)"]  # not a negative KV cache
    assert main(["fit", "qwen3-235b-a22b", "--gpu", "96.5", "--forms", "samoyeds-fp8"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("3,975 does not fit (not one 4096-token sequence)")
    model = make_model("qwen3_moe", "tiny", tmp_path / "fp8", config_only=True, fp8_block=True)
    assert main(["fit", str(model), "--forms", "samoyeds-fp8"]) == 0
    assert "from this FP8 one (its other projections stay FP8)" in capsys.readouterr().out
    converted = tmp_path / "converted"  # from a walk: a converted checkpoint was listed as if it were dense
    converted.mkdir()
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "samoyeds", "format_version": 2, "pattern": "2:4",
                                     "values": "float8_e4m3fn", "scale": "channel"}  # fmt: skip
    (converted / "config.json").write_text(json.dumps(config))
    assert main(["fit", str(converted)]) == 0
    assert "is converted already: it is the 2of4-fp8 row" in capsys.readouterr().out
    short = tmp_path / "short"  # a config.json cut short
    short.mkdir()
    (short / "config.json").write_text('{"model_type": "qwen3_moe", "num_experts": 8}')
    for bad, words in [
        (["fit", str(tmp_path / "none")], "no such directory"),
        (["fit", "qwen3-30b"], "neither a model directory nor a preset"),
        (["fit", "qwen3-30b-a3b", "--gpu", "a100"], "--gpu 'a100'"),
        (["fit", "qwen3-30b-a3b", "--forms", "sparse"], "unknown form sparse"),
        (["fit", "qwen3-30b-a3b", "--gpu-memory-utilization", "1.5"], "utilization"),
        (["fit", "qwen3-30b-a3b", "--gpu", "inf"], "--gpu 'inf'"),
        (["fit", "qwen3-30b-a3b", "--gpu", "-5"], "--gpu '-5'"),
        (["fit", "qwen3-30b-a3b", "--seq-len", "0"], "sequence length"),
        (["fit", "qwen3-30b-a3b", "--overhead-gib", "-1"], "overhead"),
        (["fit", "qwen3-30b-a3b", "--segment", "100"], "segment"),
        (["fit", "qwen3-30b-a3b", "-tp", "3"], "no form of qwen3-30b-a3b runs on 3 GPUs"),
        (["fit", "qwen3-30b-a3b", "--seq-len", "100000"], "100000 is past the model's context of 40960"),
        (["fit", str(short)], "its config has no 'num_hidden_layers'"),
    ]:
        assert main(bad) == 2
        assert words in capsys.readouterr().err
