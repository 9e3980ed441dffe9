"""benchmarks/detokenize.py: vLLM's output processor timed with the made-up models' tokenizers, on CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "detokenize.py"


@pytest.mark.vllm
def test_detokenize_times_both_tokenizers(tmp_path):
    out = tmp_path / "detok.json"
    command = [
        sys.executable,
        str(SCRIPT),
        "--preset",
        "mixtral-8x7b",
        "--batch",
        "4",
        "--steps",
        "8",
        "--prompt-len",
        "32",
    ]
    done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert (record["vocab_size"], record["batch"], record["steps"], record["prompt_len"]) == (32000, 4, 8, 32)
    rows = record["results"]
    assert [r["tokens"] for r in rows.values()] == [1000, 32000]
    assert all(r["median_ms_per_step"] > 0 and r["total_s"] > 0 for r in rows.values())
    assert "filled to the vocabulary" in done.stdout
