"""benchmarks/profile_decode.py: kernel categories from a trace, and a run through vLLM on CPU."""

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "profile_decode.py"
spec = importlib.util.spec_from_file_location("profile_decode", SCRIPT)
profile_decode = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_decode)


def test_kernel_times_by_category(tmp_path):
    events = [
        {"cat": "kernel", "name": "_ZN8samoyeds8moe_gemmI13__nv_bfloat16Lb1ELi128ELi8ELb1EEEvPKT_", "ts": 0, "dur": 20},
        {"cat": "kernel", "name": "fused_moe_kernel", "ts": 20, "dur": 30},
        {"cat": "kernel", "name": "void vllm::act_and_mul_kernel<c10::BFloat16, ...>", "ts": 50, "dur": 3},
        {"cat": "kernel", "name": "void flash::flash_fwd_splitkv_kernel<...>", "ts": 60, "dur": 7},
        {"cat": "kernel", "name": "nvjet_tst_128x64_64x4_1x2_h_bz_coopA_TNT", "ts": 70, "dur": 5},
        {"cat": "kernel", "name": "triton_poi_fused_add_rms_norm_0", "ts": 80, "dur": 2},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000},  # host events are not GPU time
    ]
    with gzip.open(tmp_path / "worker.pt.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    kernels = profile_decode.read_trace(tmp_path).kernels
    times = profile_decode.kernel_times(kernels)
    assert times["fused_moe_kernel"] == 30.0 and "aten::mm" not in times
    assert profile_decode.by_category(times) == {"moe": 53.0, "attention": 7.0, "gemm": 5.0, "other": 2.0}


def test_steady_decode_steps_are_the_windows_between_whole_batch_decodes(tmp_path):
    """Windows from one step decoding the whole batch to the next such step, on the GPU's clock; kernels cut at the
    windows' edges."""
    steps = [
        (0, "execute_context_3(48)_generation_0(0)"),  # the prompts' prefill: no window
        (100, "execute_context_0(0)_generation_3(3)"),
        (200, "execute_context_0(0)_generation_3(3)"),
        (
            300,
            "execute_3_context_0(sq0sk0sqsq0sqsk0)_generation_3(sq3sk3090sqsq3sqsk3090)",
        ),  # detailed_trace_annotation
        (400, "execute_context_0(0)_generation_3(3)"),
        (500, "execute_context_0(0)_generation_2(2)"),  # a sequence finished: the last window ends here
    ]
    events = [{"cat": "gpu_user_annotation", "name": n, "ts": ts, "dur": 5} for ts, n in steps]
    events += [
        {"cat": "kernel", "name": "fused_moe_kernel", "ts": 10, "dur": 80},  # the prefill's, outside every window
        {"cat": "kernel", "name": "fused_moe_kernel", "ts": 110, "dur": 40},
        {"cat": "kernel", "name": "flash_fwd_kernel", "ts": 190, "dur": 40},  # 10 µs in one window, 30 in the next
        {"cat": "kernel", "name": "fused_moe_kernel", "ts": 310, "dur": 50},
        {"cat": "kernel", "name": "nvjet_tst", "ts": 420, "dur": 60},  # after the last window
        # the host's annotations run on the CPU's clock, ahead of the kernels: not the windows' edges
        {"cat": "user_annotation", "name": "execute_context_0(0)_generation_3(3)", "ts": 150, "dur": 5},
    ]
    with gzip.open(tmp_path / "worker.pt.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    trace = profile_decode.read_trace(tmp_path)
    found = trace.steps
    assert found == [(0, 3, 0), (100, 0, 3), (200, 0, 3), (300, 0, 3), (400, 0, 3), (500, 0, 2)]
    steady = profile_decode.decode_steps(trace.kernels, found, 3)
    assert steady == {
        "windows": 3,
        "wall_ms": 0.1,
        "median_wall_ms": 0.1,
        "gpu_busy_ms": pytest.approx((40 + 10 + 30 + 50) / 3 / 1e3),
        "kernel_ms": {"attention": pytest.approx(40 / 3 / 1e3), "moe": pytest.approx(90 / 3 / 1e3)},
        "top_kernels_us": [
            {"name": "fused_moe_kernel", "category": "moe", "us": 30.0},
            {"name": "flash_fwd_kernel", "category": "attention", "us": pytest.approx(40 / 3)},
        ],
    }
    assert profile_decode.decode_steps([], found[:2], 3) is None  # no two whole-batch decode steps in a row


@pytest.mark.parametrize(
    "name",
    [
        "execute_context_0(0)_generation_2(2)x(3)",
        "execute_context_0(0)_generation_3(3)_generation_4(4)",
        "execute_context_0(0)_decode_2(2)",
    ],
)
def test_a_step_name_of_another_shape_is_not_a_step(tmp_path, name):
    (tmp_path / "t.json").write_text(
        json.dumps({"traceEvents": [{"cat": "gpu_user_annotation", "name": name, "ts": 1}]})
    )
    assert profile_decode.read_trace(tmp_path).steps == []


def test_a_kernel_across_a_window_edge_keeps_its_time_before_one_started_after_it():
    """Cut at the window's start, two kernels begin at the same instant: the one launched first keeps it."""
    steps = [(100.0, 0, 1), (200.0, 0, 1)]
    kernels = [("flash_fwd_kernel", 98.0, 10.0), ("fused_moe_kernel", 95.0, 20.0)]  # the trace's order, not the launch
    steady = profile_decode.decode_steps(kernels, steps, 1)
    assert steady["kernel_ms"] == {"moe": pytest.approx(15 / 1e3)} and steady["gpu_busy_ms"] == pytest.approx(15 / 1e3)


def test_overlapping_kernels_time_goes_to_the_one_started_first():
    """A dependent launch starts while the kernel before it runs and waits: the overlap is the earlier kernel's."""
    kernels = [("a", 0.0, 10.0), ("b", 6.0, 9.0), ("c", 7.0, 2.0), ("d", 20.0, 4.0), ("b", 22.0, 10.0)]
    times = profile_decode.kernel_times(kernels)
    assert times == {"a": 10.0, "b": 5.0 + 8.0, "d": 4.0}  # c ran inside a's span; d's span hides b's first 2 µs
    assert sum(times.values()) == profile_decode.busy_time(kernels) == 27.0
    assert profile_decode.kernel_spans(kernels) == {"a": 10.0, "b": 19.0, "c": 2.0, "d": 4.0}


def test_busy_time_counts_overlapping_kernels_once():
    kernels = [("a", 0.0, 10.0), ("b", 5.0, 10.0), ("c", 30.0, 2.0), ("d", 31.0, 0.5)]
    assert profile_decode.busy_time(kernels) == 17.0  # [0, 15) and [30, 32)
    assert profile_decode.largest_gaps(kernels) == [{"us": 15.0, "after": "b", "before": "c"}]


def test_the_table_marks_a_profile_that_stalled_on_a_compile():
    step = {"wall_ms_per_step": 828.5, "gpu_busy_ms_per_step": 223.6, "kernel_ms_per_step": {"moe": 138.3}}
    text = profile_decode.table({"dense-fp8": {"256": {**step, "stalled": True}}, "samoyeds-fp8": {"256": step}})
    rows = text.splitlines()
    assert rows[1].endswith("* stalled") and not rows[2].endswith("stalled")
    assert "wall and idle times include it" in rows[-1]


def test_the_table_and_plot_show_the_steady_decode_steps_beside_the_run(tmp_path):
    steady = {"windows": 30, "wall_ms": 15.5, "gpu_busy_ms": 14.1, "kernel_ms": {"moe": 4.5, "attention": 7.6}}
    step = {"wall_ms_per_step": 53.3, "gpu_busy_ms_per_step": 15.4, "kernel_ms_per_step": {"moe": 5.1}}
    results = {"samoyeds-fp8": {"256": {**step, "decode_steps": steady}}, "dense-fp8-deepgemm": {"256": step}}
    lines = profile_decode.table(results).splitlines()
    assert lines[2].split()[:4] == ["samoyeds-fp8", "decode", "256", "15.50"] and lines[2].split()[4] == "1.40"
    assert lines[3].split()[0] == "dense-fp8-deepgemm" and lines[-1].startswith("'decode'")
    assert len({line.index(" 256 ") for line in lines[1:4]}) == 1  # the columns line up under the longest label
    assert [row.label for row in profile_decode.rows(results)] == [
        "samoyeds-fp8",
        "samoyeds-fp8 decode",
        "dense-fp8-deepgemm",
    ]
    pytest.importorskip("matplotlib")
    profile_decode.plot({"preset": "p", "date": "d", "results": results}, tmp_path / "profile-decode.png")
    assert (tmp_path / "profile-decode.png").stat().st_size > 0


def _decode_trace(folder: Path, batch: int) -> None:
    """Three whole-batch decode steps 1 ms apart, one kernel of 0.5 ms in the first."""
    folder.mkdir()
    events = [
        {"cat": "gpu_user_annotation", "name": f"execute_context_0(0)_generation_{batch}({batch})", "ts": ts, "dur": 1}
        for ts in (0, 1000, 2000)
    ] + [{"cat": "kernel", "name": "fused_moe_kernel", "ts": 100, "dur": 500}]
    (folder / "worker.pt.trace.json").write_text(json.dumps({"traceEvents": events}))


def test_reread_fills_the_decode_steps_from_the_kept_traces(tmp_path):
    step = {"wall_ms_per_step": 5.0, "gpu_busy_ms_per_step": 1.0, "kernel_ms_per_step": {"moe": 1.0}}
    record = {"preset": "p", "date": "d", "results": {"dense": {"2": step}, "samoyeds": {"2": step}}}
    saved = tmp_path / "profile-decode.json"
    saved.write_text(json.dumps(record))
    reread = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--reread"]
    _decode_trace(tmp_path / "trace-dense-b2", 2)
    missing = subprocess.run(reread, capture_output=True, text=True)
    assert missing.returncode != 0 and "trace-samoyeds-b2" in missing.stderr and "trace-dense-b2" not in missing.stderr
    assert json.loads(saved.read_text()) == record  # nothing written before every result's traces were found
    _decode_trace(tmp_path / "trace-samoyeds-b2", 2)
    done = subprocess.run(reread, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    results = json.loads(saved.read_text())["results"]
    for variant in ("dense", "samoyeds"):
        assert results[variant]["2"] == {
            **step,
            "decode_steps": {
                "windows": 2,
                "wall_ms": 1.0,
                "median_wall_ms": 1.0,
                "gpu_busy_ms": 0.25,
                "kernel_ms": {"moe": 0.25},
                "top_kernels_us": [{"name": "fused_moe_kernel", "category": "moe", "us": 250.0}],
            },
        }
    assert "dense decode" in done.stdout and not list(tmp_path.glob("*.part"))


def test_plot_has_a_panel_per_batch_and_a_bar_per_variant(tmp_path):
    pytest.importorskip("matplotlib")
    step = {"wall_ms_per_step": 5.0, "gpu_busy_ms_per_step": 4.0, "kernel_ms_per_step": {"moe": 2.0, "gemm": 2.0}}
    record = {"preset": "p", "date": "d", "results": {v: {"1": step, "16": step} for v in ("dense", "samoyeds")}}
    profile_decode.plot(record, tmp_path / "profile-decode.png")
    assert (tmp_path / "profile-decode.png").stat().st_size > 0
    record["results"] = {"dense": {"1": {**step, "kernel_ms_per_step": {}}}}  # a CPU run: no kernels, no plot
    profile_decode.plot(record, tmp_path / "cpu.png")
    assert not (tmp_path / "cpu.png").exists()


@pytest.mark.vllm
def test_profile_decode_runs_on_cpu(tmp_path):
    """The whole script through vLLM's profiler on a tiny model (CPU: wall times only, no GPU kernels)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--preset",
            "tiny-qwen3_moe",
            "--variants",
            "samoyeds",
            "--batch",
            "2",
            "--steps",
            "4",
            "--prompt-len",
            "300",
            "--cached-prompts",
            "--max-model-len",
            "320",
            "--enforce-eager",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "profile-decode.json").read_text())
    assert record["results"]["samoyeds"]["2"]["wall_ms_per_step"] > 0
    assert record["variants"] == {"samoyeds": "samoyeds(V=128), bf16 values"}
    assert record["prompt_len"] == 300 and record["cached_prompts"] is True
    # the prompts' whole KV-cache blocks (128 tokens on vLLM's CPU backend), found in the prefix cache
    assert record["results"]["samoyeds"]["2"]["cached_prompt_tokens"] >= 2 * 256
    assert list(tmp_path.glob("trace-samoyeds-b2/*.json*")), "vLLM wrote no profiler trace"
    assert "samoyeds" in done.stdout and "wall ms" in done.stdout


def test_a_model_length_shorter_than_prompt_and_steps_is_refused_before_any_engine(tmp_path):
    command = [sys.executable, str(SCRIPT), "--prompt-len", "1024", "--steps", "16", "--max-model-len", "1024"]
    done = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "shorter than --prompt-len + --steps" in done.stderr
    assert not (tmp_path / "models").exists()


class _FakeLLM:
    """vLLM's LLM as profile_variant uses it: its first profiled run leaves a 2 s GPU gap (a kernel compiled)."""

    def __init__(self, model, profiler_config, **engine_args):
        self.traces = Path(profiler_config["torch_profiler_dir"])
        self.traces.mkdir(parents=True, exist_ok=True)
        self.profiles = self.resets = 0
        self.prompts = []

    def reset_prefix_cache(self):
        self.resets += 1

    def start_profile(self):
        pass

    def generate(self, prompts, params, use_tqdm=False):
        self.prompts.append(prompts)
        return [types.SimpleNamespace(num_cached_tokens=16) for _ in prompts]

    def stop_profile(self):
        self.profiles += 1
        gap = 2e6 if self.profiles == 1 else 10.0
        events = [
            {"cat": "kernel", "name": "fused_moe_kernel", "ts": 0, "dur": 100},
            {"cat": "kernel", "name": "fused_moe_kernel", "ts": 100 + gap, "dur": 100},
        ]
        with gzip.open(self.traces / f"worker.{self.profiles}.pt.trace.json.gz", "wt") as f:
            json.dump({"traceEvents": events}, f)


@pytest.mark.parametrize("cached_prompts", [False, True])
def test_a_profiled_run_that_stalled_on_a_compile_is_profiled_again(tmp_path, monkeypatch, cached_prompts):
    llms = []
    fake_vllm = types.SimpleNamespace(LLM=lambda *a, **k: llms.append(_FakeLLM(*a, **k)) or llms[-1])
    fake_vllm.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    results = profile_decode.profile_variant(tmp_path / "m", [3], 4, 20, cached_prompts, tmp_path, {})
    llm, r = llms[0], results[3]
    assert r["profiled_runs"] == 2 and not r["stalled"] and llm.profiles == 2
    assert r["kernel_ms_per_step"] == {"moe": 200 / 1e3 / 4} and r["cached_prompt_tokens"] == 3 * 16
    assert [p.name for p in (tmp_path / "trace-m-b3").iterdir()] == [
        "worker.2.pt.trace.json.gz"
    ]  # the stalled one gone
    assert llm.resets == (0 if cached_prompts else 3)  # before the warm-up and before each profiled run
    prompts = [p["prompt_token_ids"] for p in llm.prompts[0]]
    assert len(prompts[0]) == 20 and len({tuple(p[:16]) for p in prompts}) == 3


def test_prompts_keep_distinct_first_blocks_past_a_thousand():
    firsts = {tuple(profile_decode._prompt(i, 16)) for i in range(2048)}
    assert len(firsts) == 2048
