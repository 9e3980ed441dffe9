"""Calibrated pruning layer by layer (tools/calibration.py), the data it reads (tools/text_data.py), and
`convert --method wanda|sparsegpt` with good and bad calibration input."""

import json
import shutil

import pytest
import torch
from helpers import leftovers, read_checkpoint, write_calibration_text
from safetensors.torch import load_file, save_file

from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.format import Pattern, satisfies
from samoyeds_vllm.tools.architectures import ARCHITECTURES, architecture_of
from samoyeds_vllm.tools.calibration import Calibration, _load_module, _skeleton, experts_module, prune_layers
from samoyeds_vllm.tools.checkpoint_io import CheckpointReader, read_config
from samoyeds_vllm.tools.convert import REPORT_NAME, convert
from samoyeds_vllm.tools.fused_experts import per_expert
from samoyeds_vllm.tools.text_data import DataError, calibration_windows, load_documents

PATTERNS = [Pattern.parse("2:4"), Pattern.parse("samoyeds")]


@pytest.fixture(scope="module")
def calib_dir(tmp_path_factory):
    return write_calibration_text(tmp_path_factory.mktemp("calib") / "text")


def _windows(model_dir, calib_dir, samples=8, seq_len=128, seed=0):
    return Calibration(str(calib_dir), samples, seq_len, seed).windows(model_dir, read_config(model_dir))


# ------------------------------------------------------------------------------------------------ data


def test_load_documents_from_text_jsonl_parquet_and_directories(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("first document\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "second"}) + "\n" + json.dumps({"text": ""}) + "\n")
    pq.write_table(pa.table({"body": ["third", "fourth"]}), tmp_path / "c.parquet")
    assert load_documents(tmp_path / "a.txt") == ["first document\n"]
    assert load_documents(tmp_path / "b.jsonl") == ["second"]  # empty records are skipped
    assert load_documents(tmp_path / "c.parquet", text_field="body") == ["third", "fourth"]
    with pytest.raises(DataError, match="no field 'text'.*body"):
        load_documents(tmp_path / "c.parquet")
    (tmp_path / "c.parquet").unlink()
    assert load_documents(tmp_path) == ["first document\n", "second"]  # sorted by path


def test_bad_data_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="no such file"):
        load_documents(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(DataError, match="no text in it"):
        load_documents(tmp_path / "empty.txt")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match="cannot read as jsonl"):
        load_documents(tmp_path / "bad.jsonl")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00 not utf-8")
    with pytest.raises(DataError, match="not UTF-8"):
        load_documents(tmp_path / "binary.txt")
    with pytest.raises(DataError, match="Hugging Face dataset"):
        load_documents("no-such-org/no-such-dataset-samoyeds")


def test_a_missing_file_is_not_looked_up_on_the_hub(monkeypatch):
    """A mistyped file name fails at once; a name that may be a hub dataset (a version suffix included) is looked up."""
    from samoyeds_vllm.tools import text_data

    looked_up = []
    monkeypatch.setattr(text_data, "_hub_documents", lambda name, split, field: looked_up.append(name) or ["text"])
    for name in ("calib.tx", "data/calib.jsonl", "notes.md", "./calib", "/tmp/no-such-calib"):
        with pytest.raises(DataError, match="no such file or directory"):
            load_documents(name)
    for name in ("wikitext", "mlfoundations/dclm-baseline-1.0", "Salesforce/wikitext:wikitext-2-raw-v1"):
        assert load_documents(name) == ["text"]
    assert looked_up == ["wikitext", "mlfoundations/dclm-baseline-1.0", "Salesforce/wikitext:wikitext-2-raw-v1"]


def test_calibration_windows_are_seeded_and_distinct(tiny_models, calib_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["qwen3_moe"])
    docs = load_documents(calib_dir)
    a = calibration_windows(tokenizer, docs, 8, 64, seed=0)
    assert a == calibration_windows(tokenizer, docs, 8, 64, seed=0)
    assert a != calibration_windows(tokenizer, docs, 8, 64, seed=1)
    assert len(a) == 8 and all(len(w) == 64 for w in a) and len({tuple(w) for w in a}) == 8
    with pytest.raises(DataError, match=r"gives \d+ tokens, but 100000 samples of 64 tokens need 6400000"):
        calibration_windows(tokenizer, docs, 100000, 64, seed=0)


# ---------------------------------------------------------------------------------------- the runner


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_experts_module_matches_transformers(tiny_models, arch):
    """Our stand-in for transformers' experts computes what transformers' own module does, on its routing."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models[arch], dtype=torch.float32)
    a = ARCHITECTURES[arch]
    reader = per_expert(CheckpointReader(tiny_models[arch]), a)
    names = {role: p for p, role in a.projections.items()}
    layer, num = next(iter(a.experts_per_layer(reader.names()).items()))  # the first MoE layer
    moe = next(m for m in model.model.layers[layer].modules() if hasattr(m, "experts"))
    gate, up, down = (
        torch.stack([reader.get(a.expert_weight_name(layer, e, names[r])) for e in range(num)]).float()
        for r in ("w1", "w3", "w2")
    )
    x = torch.randn(2, 9, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = moe(x)
        moe.experts = experts_module(a, gate, up, down)
        got = moe(x)
    expected, got = (t[0] if isinstance(t, tuple) else t for t in (expected, got))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_router_buffers_come_from_the_checkpoint(tiny_models):
    """GLM-4.5's score-correction bias is a buffer that selects experts: calibration routes with the checkpoint's
    (kept in float32 as transformers keeps it), not with the zeros the empty model starts from."""
    model_dir = tiny_models["glm4_moe"]
    reader = CheckpointReader(model_dir)
    gate = _skeleton(model_dir, torch.bfloat16).model.layers[1].mlp.gate
    _load_module(gate, "model.layers.1.mlp.gate", reader, "cpu", torch.bfloat16)
    bias = gate.e_score_correction_bias
    assert bias.dtype == torch.float32 and bias.abs().sum() > 0
    assert torch.equal(bias, reader.get("model.layers.1.mlp.gate.e_score_correction_bias"))


@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_sparsegpt_has_the_lowest_layer_output_error(tiny_models, calib_dir, pattern):
    """On a tiny model and fixed calibration data: SparseGPT's per-layer output error is below Wanda's and
    magnitude's (layer 0, where all three see the same inputs); every mask satisfies the pattern."""
    model = tiny_models["qwen3_moe"]
    arch = architecture_of(read_config(model))
    windows = _windows(model, calib_dir)
    first = {}
    for method in ("magnitude", "wanda", "sparsegpt"):
        results = list(prune_layers(model, arch, CheckpointReader(model), pattern, method, windows, progress=False))
        assert all(satisfies(t, pattern) for r in results for t in r.pruned.values())
        first[method] = results[0].output_error
    for role in ("w13", "w2"):
        assert first["sparsegpt"][role] < first["wanda"][role] < first["magnitude"][role], first


def test_sparsegpt_convert_is_deterministic_and_loads_as_packed(tiny_models, calib_dir, tmp_path):
    calibration = Calibration(str(calib_dir), samples=8, seq_len=128, seed=3)
    reports = []
    for name in ("a", "b"):
        reports.append(
            convert(
                tiny_models["olmoe"],
                tmp_path / name,
                Pattern.parse("samoyeds"),
                "sparsegpt",
                export_dense=tmp_path / f"{name}-dense",
                calibration=calibration,
                progress=False,
            )
        )
    a, b = read_checkpoint(tmp_path / "a"), read_checkpoint(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    report = json.loads((tmp_path / "a" / REPORT_NAME).read_text())
    assert report["method"] == "sparsegpt" and report["calibration"]["seed"] == 3
    assert set(report["layers"]["0"]["calibration"]) >= {"tokens_per_expert", "fallback_experts", "output_error"}
    assert report["peak_host_bytes"] > 0
    quant = json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"]
    assert quant["pruning_method"] == "sparsegpt"
    dense = read_checkpoint(tmp_path / "a-dense")
    pattern = Pattern.parse("samoyeds")
    experts = [n for n in dense if ARCHITECTURES["olmoe"].expert_weight_re.match(n)]
    assert experts and all(satisfies(dense[n], pattern) for n in experts)


def test_bad_calibration_input_writes_nothing(tiny_models, calib_dir, tmp_path):
    model = tiny_models["mixtral"]
    pattern = Pattern.parse("2:4")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("A few words only.")
    cases = {
        "no data": (None, "needs calibration data"),
        "missing": (Calibration(str(tmp_path / "missing.txt")), "no such file"),
        "empty": (Calibration(str(tmp_path / "empty.txt")), "no text in it"),
        "short": (
            Calibration(str(tmp_path / "short.txt"), samples=4, seq_len=64),
            r"need 256; .* \(--calib-samples, --calib-seq-len\)",
        ),
        "too long": (Calibration(str(calib_dir), samples=1, seq_len=10**6), "longer than the model's context"),
    }
    for label, (calibration, message) in cases.items():
        with pytest.raises(SamoyedsError, match=message):
            convert(model, tmp_path / "out", pattern, "sparsegpt", calibration=calibration, progress=False)
        assert not (tmp_path / "out").exists() and leftovers(tmp_path) == [], label

    # A tokenizer that does not belong to the model: ids beyond its vocabulary of 300 (embeddings cut to match).
    other = shutil.copytree(model, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"vocab_size": 300}))
    weights = load_file(other / "model.safetensors")
    cut = {n: t[:300].contiguous() for n, t in weights.items() if n in ("model.embed_tokens.weight", "lm_head.weight")}
    save_file(weights | cut, other / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SamoyedsError, match="does not belong to this model"):
        convert(other, tmp_path / "out", pattern, "wanda", calibration=Calibration(str(calib_dir), 4, 64))
    with pytest.raises(SamoyedsError, match="uses no calibration data"):
        convert(model, tmp_path / "out", pattern, "magnitude", calibration=Calibration(str(calib_dir)))
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_too_little_memory_is_refused_with_the_numbers(tiny_models, calib_dir, tmp_path, monkeypatch):
    from samoyeds_vllm.tools import calibration

    model = tiny_models["qwen3_moe"]
    windows = _windows(model, calib_dir)
    arch = architecture_of(read_config(model))
    needed = calibration.peak_bytes(arch, CheckpointReader(model), windows, torch.float32)
    assert needed > 2 * 8 * 128 * 128 * 4  # at least the activations of 8 x 128 tokens, hidden 128, in and out
    monkeypatch.setattr(calibration, "available_bytes", lambda device: needed // 2)
    with pytest.raises(SamoyedsError, match=r"needs about [\d.]+ GiB on cpu, and [\d.]+ GiB are free"):
        list(prune_layers(model, arch, CheckpointReader(model), PATTERNS[0], "sparsegpt", windows, device="cpu"))


def test_multimodal_llama4_calibrates_its_language_model(tiny_models, calib_dir, tmp_path):
    """Layer by layer on Llama4ForConditionalGeneration: the language model alone runs (its config the
    text_config, its tensors under language_model.), so SparseGPT prunes the experts as on the tiny text model,
    whose language model it is."""
    calibration = Calibration(str(calib_dir), samples=4, seq_len=64)
    for arch in ("llama4", "llama4_text"):
        convert(tiny_models[arch], tmp_path / arch, Pattern.parse("samoyeds"), "sparsegpt", calibration=calibration)
    multimodal, text = read_checkpoint(tmp_path / "llama4"), read_checkpoint(tmp_path / "llama4_text")
    assert all(torch.equal(t, multimodal[f"language_model.{name}"]) for name, t in text.items())
    report = json.loads((tmp_path / "llama4" / REPORT_NAME).read_text())
    assert sorted(report["layers"]) == ["1", "3"] and report["layers"]["1"]["calibration"]["output_error"]
