"""benchmarks/profile_serving.py: a trace's engine steps split into prefill, decode and idle time, and a served load
through vLLM's profiler on CPU."""

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "profile_serving.py"
spec = importlib.util.spec_from_file_location("profile_serving", SCRIPT)
profile_serving = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_serving)

from samoyeds_vllm.bench.trace import read_trace  # noqa: E402


def _trace(folder: Path, steps: list[tuple[float, str]], kernels: list[tuple[str, float, float]]) -> Path:
    folder.mkdir()
    events = [{"cat": "gpu_user_annotation", "name": name, "ts": ts, "dur": 1} for ts, name in steps]
    events += [{"cat": "kernel", "name": name, "ts": ts, "dur": dur} for name, ts, dur in kernels]
    with gzip.open(folder / "worker.pt.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    return folder


def test_steps_split_into_prefill_decode_and_the_idle_stretches_between_waves(tmp_path):
    """Two waves: a prefill step, two decode steps, 20 ms with no kernel (the clients' turn-around), again. The
    idle stretch is taken out of the decode step it falls in; gaps shorter than IDLE_MS stay in their steps."""
    prefill, decode = "execute_context_2(32)_generation_0(0)", "execute_context_0(0)_generation_2(2)"
    steps = [(0, prefill), (1000, decode), (2000, decode), (23000, prefill), (24000, decode), (25000, decode)]
    kernels = [
        ("fused_moe_kernel", 0, 800),
        ("flash_fwd_kernel", 800, 100),  # 100 µs of the prefill window without a kernel: a short gap, kept
        ("fused_moe_kernel", 1000, 500),
        ("nvjet_tst", 2000, 1000),  # then nothing for 20 ms: the turn-around, inside the second decode window
        ("fused_moe_kernel", 23000, 900),
        ("fused_moe_kernel", 24000, 400),
        ("fused_moe_kernel", 25000, 600),
    ]
    split = profile_serving.step_split(read_trace(_trace(tmp_path / "t", steps, kernels)))
    assert split["prefill"] == {
        "steps": 2,
        "window_ms": 2.0,
        "busy_ms": pytest.approx(1.8),
        "kernel_ms": {"attention": pytest.approx(0.1), "moe": pytest.approx(1.7)},
    }
    # decode windows: 1000 + (21000 - 20000 idle) + 1000 + 600 (the last ends at its last kernel)
    assert split["decode"]["steps"] == 4 and split["decode"]["window_ms"] == pytest.approx(3.6)
    assert split["decode"]["busy_ms"] == pytest.approx(2.5)
    assert split["idle"] == {"count": 1, "ms": 20.0, "mean_ms": 20.0, "largest_ms": [20.0]}
    assert split["span_ms"] == pytest.approx(25.6)
    assert profile_serving._per_wave(split, 2) == {
        "prefill_window_ms": 1.0,
        "prefill_busy_ms": pytest.approx(0.9),
        "decode_window_ms": pytest.approx(1.8),
        "decode_busy_ms": pytest.approx(1.25),
        "idle_ms": 10.0,
    }


def test_a_trace_without_steps_splits_into_nothing(tmp_path):
    split = profile_serving.step_split(read_trace(_trace(tmp_path / "t", [], [])))
    assert split["prefill"]["steps"] == split["decode"]["steps"] == split["idle"]["count"] == split["span_ms"] == 0


def test_idle_before_the_first_step_is_not_the_loads(tmp_path):
    """The profiler starts before the load's requests arrive: kernels then (a stray warm-up) and the wait after them
    lie outside the steps' span, and the windows and idle stretches add up to it."""
    decode = "execute_context_0(0)_generation_2(2)"
    steps = [(50000, decode), (51000, decode), (80000, decode)]
    kernels = [("stray", 0, 100), ("fused_moe_kernel", 50000, 500), ("fused_moe_kernel", 51000, 500)]
    kernels.append(("fused_moe_kernel", 80000, 500))
    split = profile_serving.step_split(read_trace(_trace(tmp_path / "t", steps, kernels)))
    assert split["idle"]["ms"] == pytest.approx(28.5)  # 51500 -> 80000; not 100 -> 50000
    assert split["span_ms"] == pytest.approx(30.5)
    assert split["decode"]["window_ms"] + split["idle"]["ms"] == pytest.approx(split["span_ms"])


def test_client_summary_takes_the_median_gap_of_every_request():
    result = {"duration": 4.0, "output_throughput": 10.0, "mean_ttft_ms": 50.0, "completed": 4}
    result["itls"] = [[0.010, 0.012], [0.011], [0.030, 0.010]]
    summary = profile_serving.client_summary(result, waves=2)
    assert summary["wave_s"] == 2.0 and summary["median_itl_ms"] == pytest.approx(11.0)
    assert profile_serving.client_summary({"duration": 1.0, "median_itl_ms": 9.0}, 1)["median_itl_ms"] == 9.0


def test_the_table_says_when_the_traces_had_no_steps():
    split = {
        "prefill": {"steps": 0, "window_ms": 0.0, "busy_ms": 0.0, "kernel_ms": {}},
        "decode": {"steps": 0, "window_ms": 0.0, "busy_ms": 0.0, "kernel_ms": {}},
        "idle": {"count": 0, "ms": 0.0, "mean_ms": 0.0, "largest_ms": []},
    }
    result = {"untimed": {"wave_s": 1.5}, "profiled": {"wave_s": 1.9}, "engine": split}
    lines = profile_serving.table({"samoyeds": result}, 2).splitlines()
    assert lines[1].split()[:3] == ["samoyeds", "1.500", "1.900"] and "client times only" in lines[-1]


def test_bad_arguments_are_refused_before_any_server(tmp_path):
    run = [sys.executable, str(SCRIPT), "--out", str(tmp_path)]
    done = subprocess.run([*run, "--variants", "dense,nope"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unknown variants nope" in done.stderr
    done = subprocess.run([*run, "--mix", "128x128"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "a mix is INPUT:OUTPUT" in done.stderr
    done = subprocess.run([*run, "--engine-args", "-tp 2"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "one GPU only" in done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.vllm
def test_profile_serving_runs_on_cpu(tmp_path):
    """The whole script: a tiny model served on CPU with vLLM's profiler, an untimed and a profiled load of two
    waves (CPU: client times, a trace without GPU kernels)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    command = [sys.executable, str(SCRIPT), "--preset", "tiny-qwen3_moe", "--variants", "samoyeds"]
    command += ["--concurrency", "2", "--waves", "2", "--mix", "16:4", "--api-servers", "1", "--out", str(tmp_path)]
    command += ["--engine-args", "--max-model-len 128 --enforce-eager --num-gpu-blocks-override 32"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "profile-serving.json").read_text())
    result = record["results"]["samoyeds"]
    for load in ("untimed", "profiled"):
        assert result[load]["completed"] == 4 and result[load]["wave_s"] > 0
    assert "--profiler-config" in result["server_args"]
    assert list((tmp_path / "trace-samoyeds").glob("*.json*")), "vLLM wrote no profiler trace"
    assert "samoyeds" in done.stdout and "wave s" in done.stdout
