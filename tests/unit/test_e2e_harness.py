"""`bench e2e` without engines: the variant table, what each variant's processes get, and the comparison."""

import json
import types

import pytest

from samoyeds_vllm.bench.e2e import (
    DEFAULT_VARIANTS,
    VARIANTS,
    Workload,
    _label,
    engine_tensor_parallel_size,
    markdown,
    plot,
    variant_env,
    watched_jit_caches,
)
from samoyeds_vllm.cli import build_parser, main
from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.tools import vllm_server
from samoyeds_vllm.tools.vllm_server import deep_gemm_cache, without_jit


def _e2e_action(dest):
    bench = next(a for a in build_parser()._subparsers._group_actions[0].choices["bench"]._actions if a.choices)
    return next(a for a in bench.choices["e2e"]._actions if a.dest == dest)


def test_the_help_names_every_variant_and_the_default_is_the_issue_set():
    assert all(name in _e2e_action("variants").help for name in VARIANTS)
    assert _e2e_action("variants").default == ",".join(DEFAULT_VARIANTS)
    assert DEFAULT_VARIANTS == ("dense", "dense-fp8", "samoyeds", "samoyeds-fp8")


def test_each_variant_gets_vllms_default_moe_kernels_unless_it_names_others(monkeypatch):
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "1")  # set in a user's shell: would force DeepGEMM on every FP8 MoE
    monkeypatch.setenv("VLLM_MOE_USE_DEEP_GEMM", "0")
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM_E8M0", "0")  # would let DeepGEMM's MoE fall back to Triton
    for name in ("dense", "dense-fp8", "samoyeds", "samoyeds-fp8", "2of4-fp8", "samoyeds-fp8-from-fp8"):
        env = variant_env(VARIANTS[name])
        assert not {"VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0"} & env.keys()
    deepgemm = variant_env(VARIANTS["dense-fp8-deepgemm"])
    assert deepgemm["VLLM_USE_DEEP_GEMM"] == deepgemm["VLLM_MOE_USE_DEEP_GEMM"] == "1"
    assert "VLLM_USE_DEEP_GEMM_E8M0" not in deepgemm  # vLLM's default (on): DeepGEMM at every token count
    # DeepGEMM's MoE with Triton for the batches too small for its contiguous layout: E8M0 scales off
    hybrid = variant_env(VARIANTS["dense-fp8-deepgemm-or-triton"])
    assert hybrid["VLLM_USE_DEEP_GEMM"] == hybrid["VLLM_MOE_USE_DEEP_GEMM"] == "1"
    assert hybrid["VLLM_USE_DEEP_GEMM_E8M0"] == "0"
    # Engines with FP8 block projections skip DeepGEMM's start-up precompilation; the untimed runs compile what
    # is timed.
    assert {n for n, v in VARIANTS.items() if variant_env(v).get("VLLM_DEEP_GEMM_WARMUP") == "skip"} == {
        "dense-fp8",
        "dense-fp8-deepgemm",
        "dense-fp8-deepgemm-or-triton",
        "samoyeds-fp8-from-fp8",
    }


@pytest.mark.parametrize(
    "name, quant",
    [
        ("dense", None),
        ("dense-fp8", {"quant_method": "fp8", "weight_block_size": [128, 128]}),
        ("samoyeds", {"quant_method": "samoyeds", "pattern": "samoyeds", "format_version": 1}),
        ("samoyeds-fp8", {"quant_method": "samoyeds", "pattern": "samoyeds", "format_version": 2}),
        ("2of4-fp8", {"quant_method": "samoyeds", "pattern": "2:4", "format_version": 2}),
        (
            "samoyeds-fp8-from-fp8",
            {"quant_method": "samoyeds", "pattern": "samoyeds", "format_version": 3, "values": "float8_e4m3fn"},
        ),
    ],
)
def test_the_models_of_the_variants(tmp_path, name, quant):
    config = json.loads((VARIANTS[name].model("tiny-qwen3_moe", None, tmp_path / name) / "config.json").read_text())
    got = config.get("quantization_config")
    assert got == quant if quant is None else {k: got.get(k) for k in quant} == quant


def test_the_model_converted_from_fp8_keeps_the_other_projections_in_fp8_blocks(tmp_path):
    model = VARIANTS["samoyeds-fp8-from-fp8"].model
    config = json.loads((model("tiny-qwen3_moe", None, tmp_path) / "config.json").read_text())
    other_layers = config["quantization_config"]["other_layers"]
    assert other_layers["quant_method"] == "fp8"
    assert other_layers["weight_block_size"] == [128, 128]
    assert model.fp8_projections and model.needs_cuda


def test_fp8_dense_variants_are_refused_without_a_gpu(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["bench", "e2e", "--out", str(tmp_path), "--variants", "samoyeds,dense-fp8-deepgemm"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "dense-fp8-deepgemm runs vLLM's FP8 block-quantized layers, which need an NVIDIA GPU" in err
    assert "without one, pass --variants dense,samoyeds,samoyeds-fp8,2of4,2of4-fp8" in err
    assert not list(tmp_path.iterdir())


def _result(model, offline, tpot=None, kv=None, failed=None):
    result = {
        "settings": {"model": model},
        "env": {"VLLM_DEEP_GEMM_WARMUP": "skip"} if "FP8 128" in model else {},
        "throughput": [
            {"input_len": 128, "output_len": 128, "batch_size": b, "output_tokens_per_s": x} for b, x in offline.items()
        ],
        "offline_engines": {"128x128": {"max_num_seqs": 1024, "kv_cache_tokens": kv}},
    }
    if tpot is not None:
        level = {"concurrency": 1, "output_tokens_per_s": 1000 / tpot, "median_tpot_ms": tpot}
        result["serving"] = {"input_len": 128, "output_len": 128, "levels": [level]}
    if failed:
        result = {"settings": {"model": model}, "failed": failed}
    return result


def test_the_comparison_is_against_the_best_dense_variant_at_each_point():
    results = {
        "preset": "qwen3-30b-a3b",
        "date": "2026-11-25",
        "device": "NVIDIA H100 80GB HBM3",
        "vllm": "0.26.0",
        "torch": "2.11.0",
        "engine_args": ["--max-model-len", "4096"],
        "variants": {
            "dense": _result("dense, bf16", {1: 235, 16: 1227}, tpot=4.0, kv=708_000),
            "dense-fp8": _result("dense, FP8 128x128 blocks", {1: 231, 16: 2886}, tpot=5.0, kv=1_010_000),
            "samoyeds": _result("samoyeds(V=128), bf16 values", {1: 266, 16: 2168}, tpot=3.2, kv=1_140_000),
            "2of4-fp8": _result("2:4, FP8 values", {}, failed="torch.OutOfMemoryError: CUDA out of memory"),
        },
    }
    text = markdown(results)
    assert "NVIDIA H100 80GB HBM3, vLLM 0.26.0, torch 2.11.0" in text
    assert "`--load-format dummy --max-model-len 4096`" in text
    assert "| in/out | batch | dense | dense-fp8 | samoyeds | 2of4-fp8 | best dense |" in text
    assert "| 128/128 | 1 | 235 | 231 | 266 (1.13×) | - | dense |" in text  # bf16 is the better dense at bs 1
    assert "| 128/128 | 16 | 1,227 | 2,886 | 2,168 (0.75×) | - | dense-fp8 |" in text  # FP8 at bs 16
    assert "| 1 | 4.00 | 5.00 | 3.20 (1.25×) | - | dense |" in text  # TPOT: the lower dense, dense / ours
    assert "| KV-cache tokens | 708,000 | 1,010,000 | 1,140,000 (1.13×) | - | dense-fp8 |" in text
    assert "**2of4-fp8 did not run**: torch.OutOfMemoryError: CUDA out of memory" in text
    assert "still compiled" not in text
    assert "| dense-fp8 | 1 | dense, FP8 128x128 blocks | VLLM_DEEP_GEMM_WARMUP=skip | max_num_seqs 1024 |" in text
    assert "Not one GPU each" not in text


def test_dense_spread_over_several_gpus_against_sparse_on_one():
    work = Workload(engine_args=("--max-model-len", "4096"), dense_tensor_parallel_size=2)
    assert work.variant_engine_args(VARIANTS["dense-fp8"])[-2:] == ["--tensor-parallel-size", "2"]
    assert "--tensor-parallel-size" not in work.variant_engine_args(VARIANTS["samoyeds-fp8"])
    assert work.variant_engine_args(VARIANTS["samoyeds-fp8"])[-2:] == ["--max-model-len", "4096"]
    assert "--tensor-parallel-size" not in Workload().variant_engine_args(VARIANTS["dense"])
    dense = _result("dense, FP8 128x128 blocks", {64: 1000})
    dense["settings"]["gpus"] = 2
    dense["offline_engines"]["128x128"]["estimated_max_seqs"] = {"tokens": 4096, "sequences": 30.08}
    sparse = _result("samoyeds(V=128), FP8 values", {64: 900})
    sparse["offline_engines"]["128x128"]["estimated_max_seqs"] = {"tokens": 4096, "sequences": 55.21}
    results = {
        "preset": "qwen3-235b-a22b",
        "date": "2026-11-26",
        "device": "2 x NVIDIA H200",
        "vllm": "0.26.0",
        "torch": "2.11.0",
        "engine_args": [],
        "variants": {"dense-fp8": dense, "samoyeds-fp8": sparse},
    }
    text = markdown(results)
    assert "| concurrent 4096-token sequences (vLLM's estimate) | 30.1 | 55.2 (1.84×) | dense-fp8 |" in text
    assert "**Not one GPU each**: dense-fp8 ran on 2 GPUs (tensor parallel), the others on one" in text
    assert "| 128/128 | 64 | 1,000 | 900 (0.90×) | dense-fp8 |" in text
    assert "| dense-fp8 | 2 | dense, FP8 128x128 blocks |" in text
    assert "| samoyeds-fp8 | 1 | samoyeds(V=128), FP8 values |" in text
    assert [_label(results["variants"], n) for n in ("dense-fp8", "samoyeds-fp8")] == [
        "dense-fp8 (2 GPUs)",
        "samoyeds-fp8",
    ]
    sparse["settings"]["gpus"] = 2  # every variant over two GPUs (-tp 2 in --engine-args): nothing to point out
    text = markdown(results)
    assert "Not one GPU each" not in text and "| samoyeds-fp8 | 2 | samoyeds(V=128), FP8 values |" in text


def test_an_offline_only_comparison_draws_no_empty_serving_plots(tmp_path):
    pytest.importorskip("matplotlib")
    results = {"preset": "p", "date": "d", "device": "g", "variants": {"dense": _result("dense, bf16", {1: 235})}}
    (tmp_path / "latency-vs-load.png").write_bytes(b"from an earlier run")
    plot(results, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png", "offline-throughput.png"]
    plot({**results, "variants": {"dense": _result("dense, bf16", {})}}, tmp_path)  # nothing offline either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png"]


@pytest.mark.parametrize(
    "flags, tp",
    [((), None), (("--max-model-len", "4096"), None), (("-tp", "2"), 2), (("--tensor-parallel-size=4",), 4)],
)
def test_the_tensor_parallelism_engine_flags_give_every_variant(flags, tp):
    assert engine_tensor_parallel_size(flags) == tp
    work = Workload(engine_args=flags)
    assert work.gpus(VARIANTS["samoyeds"]) == work.gpus(VARIANTS["dense"]) == (tp or 1)
    args = work.variant_engine_args(VARIANTS["dense"])
    assert args[len(args) - len(flags) :] == list(flags)  # as given, nothing added after them


def test_the_server_gets_several_api_servers_and_no_prefix_cache():
    """One API server process capped samoyeds FP8 at 256 clients (its core saturated), and vllm bench serve's random
    prompts repeat with the made-up models' small vocabulary: both would hide what the MoE does."""
    work = Workload(engine_args=("--max-model-len", "4096"))
    args = work.server_args(VARIANTS["samoyeds"])
    assert args[:-3] == work.variant_engine_args(VARIANTS["samoyeds"])
    assert args[-3:] == ["--no-enable-prefix-caching", "--api-server-count", "4"]
    assert Workload(api_servers=2).server_args(VARIANTS["dense"])[-1] == "2"


def test_api_servers_must_be_a_number_of_processes(tmp_path, capsys):
    assert main(["bench", "e2e", "--out", str(tmp_path), "--variants", "samoyeds", "--api-servers", "0"]) == 2
    assert "--api-servers wants a number of processes, not 0" in capsys.readouterr().err
    for flags in ("--api-server-count 2", "-asc=2"):
        assert main(["bench", "e2e", "--out", str(tmp_path), "--variants", "samoyeds", f"--engine-args={flags}"]) == 2
        assert "give the API server processes with --api-servers" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything ran


def test_report_of_an_output_without_results_fails(tmp_path, capsys):
    """`--report` on a folder no run wrote into (a mistyped OUT) said so and exited 0, as if it had compared."""
    assert main(["bench", "e2e", "--report", "--out", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("samoyeds-vllm bench e2e: error: ") and "is not a folder" in err
    assert main(["bench", "e2e", "--report", "--out", str(tmp_path)]) == 2
    assert "holds no variant-*.json" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    # a results file cut short, or another tool's: a traceback before
    (tmp_path / "variant-samoyeds.json").write_text('{"x":')
    assert main(["bench", "e2e", "--report", "--out", str(tmp_path)]) == 2
    assert "variant-samoyeds.json: not readable as bench e2e's results" in capsys.readouterr().err
    (tmp_path / "variant-samoyeds.json").write_text('{"variant": "samoyeds"}')
    assert main(["bench", "e2e", "--report", "--out", str(tmp_path)]) == 2
    assert "variant-samoyeds.json: not bench e2e's results (no settings)" in capsys.readouterr().err


def test_an_unknown_model_is_refused_before_out_is_made(tmp_path, capsys):
    assert main(["bench", "e2e", "--model", "qwen3-30b", "--out", str(tmp_path / "out")]) == 2
    assert "unknown preset 'qwen3-30b'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_dense_tp_must_be_a_number_of_visible_gpus_given_once(tmp_path, capsys, monkeypatch):
    def e2e(*flags):
        return main(["bench", "e2e", "--out", str(tmp_path), "--variants", "samoyeds", *flags])

    assert e2e("--dense-tp", "0") == 2
    assert "--dense-tp wants a number of GPUs, not 0" in capsys.readouterr().err
    assert e2e("--dense-tp", "2", "--engine-args", "-tp 2") == 2
    assert "give the tensor parallelism once" in capsys.readouterr().err
    monkeypatch.setattr(vllm_server, "gpu_memory_used", lambda: [0.0])
    assert e2e("--dense-tp", "2") == 2
    assert "--dense-tp 2: only 1 GPU(s) visible" in capsys.readouterr().err
    with pytest.raises(SamoyedsError, match="wants a number of GPUs, not 'two'"):
        engine_tensor_parallel_size(["-tp", "two"])


@pytest.mark.parametrize(
    "visible, ids", [(None, None), ("1", ["1"]), ("0, 1", ["0", "1"]), ("GPU-ab12", ["GPU-ab12"]), ("", [])]
)
def test_gpu_memory_is_read_on_the_visible_gpus_only(monkeypatch, visible, ids):
    """Another job may use the GPUs this run does not see: waiting for their memory would never end."""
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    asked = []

    def answer(query, *formats, gpus=None):
        asked.append(gpus)
        return "\n".join("2048" for _ in gpus or ["0", "1"]) + "\n"

    monkeypatch.setattr(vllm_server, "nvidia_smi", answer)
    used = vllm_server.gpu_memory_used()
    if ids == []:  # no GPU visible: nothing to wait for
        assert used is None and asked == []
    else:
        assert asked == [ids] and used == [2.0] * (len(ids) if ids else 2)


def test_an_engine_group_is_ended_with_its_leader(tmp_path):
    """Engine processes outlive the process that started them: whatever the group left is killed, and a run past
    its time limit is stopped."""
    import os
    import time

    from samoyeds_vllm.bench.e2e import _run_group

    pid_file = tmp_path / "pid"
    script = f"sleep 60 & echo $! > {pid_file}; exit 3"
    assert _run_group(["sh", "-c", script], tmp_path / "log", os.environ, timeout=30) == 3
    left = int(pid_file.read_text())
    for _ in range(50):  # killed; gone once reaped by whoever adopted it
        try:
            os.kill(left, 0)
            with open(f"/proc/{left}/stat") as f:
                if f.read().split()[2] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {left} of the group still runs")
    start = time.monotonic()
    assert _run_group(["sleep", "60"], tmp_path / "log", os.environ, timeout=1) is None
    assert time.monotonic() - start < 10


def test_the_next_engine_waits_for_the_gpu_memory_of_the_last(monkeypatch):
    from samoyeds_vllm.errors import SamoyedsError
    from samoyeds_vllm.tools import vllm_server

    readings = iter([[60.0], [30.0], [1.2]])
    monkeypatch.setattr(vllm_server, "gpu_memory_used", lambda: next(readings))
    monkeypatch.setattr(vllm_server.time, "sleep", lambda s: None)
    vllm_server.wait_for_gpu_memory([0.5])  # returns at 1.2 GiB: within 1 GiB of what was used before
    monkeypatch.setattr(vllm_server, "gpu_memory_used", lambda: [60.0])
    monkeypatch.setattr(vllm_server, "gpu_processes", lambda: "1234, python, 61000 MiB")
    with pytest.raises(SamoyedsError, match="still in use .* holders: 1234, python"):
        vllm_server.wait_for_gpu_memory([0.5], timeout=0)
    vllm_server.wait_for_gpu_memory(None)  # no GPU: nothing to wait for


def test_a_timed_out_start_says_so():
    from samoyeds_vllm.bench.e2e import _failure_reason

    failed = "offline run of dense-fp8-128x128 failed (timed out after 400 s); log x:\nModel loading took 29 GiB memory"
    assert _failure_reason(failed).startswith("offline run of dense-fp8-128x128 failed (timed out after 400 s)")
    assert _failure_reason("a\nERROR torch.OutOfMemoryError: CUDA out of memory\nb") == (
        "ERROR torch.OutOfMemoryError: CUDA out of memory"
    )


JIT_LINE = "WARNING [jit_monitor.py:135] Triton kernel JIT compilation during inference: fused_moe_kernel.\n"


@pytest.mark.parametrize("compiles, runs", [([0], 1), ([2, 0], 2), ([1, 1, 1], 3)])
def test_a_timed_run_that_compiles_a_kernel_is_run_again(tmp_path, compiles, runs):
    log = tmp_path / "engine.log"
    log.write_text(JIT_LINE)  # before the timed runs: not theirs
    calls = iter(compiles)
    seen = []

    def measure(run):
        seen.append(run)
        with open(log, "a") as f:
            f.write("INFO step\n" + JIT_LINE * next(calls))
        return "result"

    result, jit = without_jit(measure, log)
    assert result == "result" and seen == list(range(runs))  # each run knows it is a rerun (to draw new prompts)
    assert jit == {"timed_runs": runs, "jit_compiles": sum(compiles), "jit_free": compiles[-1] == 0}


def test_a_timed_run_during_which_deep_gemm_compiled_is_run_again(tmp_path):
    """DeepGEMM logs nothing when it compiles a kernel (vLLM's dense FP8 linears, its warm-up skipped); its JIT
    cache gaining a kernel folder during a timed run counts as a compile."""
    log, cache = tmp_path / "engine.log", tmp_path / "deep_gemm"
    (cache / "cache" / "kernel.old").mkdir(parents=True)
    (cache / "cache" / "kernel.old" / "kernel.cubin").write_bytes(b"x")  # before the timed runs: not theirs
    new_kernels = iter([2, 0])

    def measure(run):
        for k in range(next(new_kernels)):
            folder = cache / "cache" / f"kernel.{run}.{k}"
            folder.mkdir()
            for name in ("kernel.cu", "kernel.cubin"):
                (folder / name).write_text("x")
        return "result"

    result, jit = without_jit(measure, log, caches=[cache])
    assert result == "result"
    assert jit == {"timed_runs": 2, "jit_compiles": 2, "jit_free": True}


def test_where_deep_gemm_caches_its_kernels(tmp_path):
    assert deep_gemm_cache({"DG_JIT_CACHE_DIR": str(tmp_path / "dg")}) == tmp_path / "dg"
    assert deep_gemm_cache({"VLLM_CACHE_ROOT": str(tmp_path / "v")}) == tmp_path / "v" / "deep_gemm"
    assert deep_gemm_cache({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "vllm" / "deep_gemm"


def test_only_engines_with_fp8_block_projections_watch_deep_gemms_cache(tmp_path):
    """DeepGEMM's cache is shared by every engine of the user: a samoyeds engine beside a dense FP8 one on another
    GPU saw the dense engine's compiles as its own and timed its batches three times."""
    env = {"DG_JIT_CACHE_DIR": str(tmp_path / "dg")}
    watched = {name for name, variant in VARIANTS.items() if watched_jit_caches(variant, env)}
    assert watched == {"dense-fp8", "dense-fp8-deepgemm", "dense-fp8-deepgemm-or-triton", "samoyeds-fp8-from-fp8"}
    assert watched_jit_caches(VARIANTS["dense-fp8"], env) == [tmp_path / "dg"]


def test_the_report_names_points_whose_timed_runs_all_compiled():
    dense = _result("dense, bf16", {1: 235, 16: 1227})
    dense["throughput"][1].update(timed_runs=3, jit_compiles=3, jit_free=False)
    results = {"preset": "p", "date": "d", "device": "g", "vllm": "v", "torch": "t", "engine_args": []}
    text = markdown({**results, "variants": {"dense": dense}})
    assert "**A kernel was still compiled in every timed run** (so these include it): dense 128/128 batch 16" in text


def test_where_a_served_ttft_went_is_read_from_the_servers_histograms(monkeypatch):
    """The mean of each interval over the requests that finished during the load, summed over the label sets of
    every API server process; the report splits TTFT into queue, prefill and the rest."""
    from samoyeds_vllm.bench import e2e

    def text(requests, ttft, queue, prefill):
        lines = []
        for server in ("0", "1"):  # two API server processes, half the requests each
            for name, total in (
                ("time_to_first_token_seconds", ttft),
                ("request_queue_time_seconds", queue),
                ("request_prefill_time_seconds", prefill),
            ):
                labels = f'{{engine="0",model_name="m",pid="{server}"}}'
                lines += [f"vllm:{name}_sum{labels} {total / 2}", f"vllm:{name}_count{labels} {requests / 2}"]
        lines.append('vllm:request_decode_time_seconds_bucket{le="+Inf"} 5.0')  # buckets are not the count
        return "\n".join(lines) + "\n"

    pages = iter([text(4, 0.2, 0.04, 0.08), text(12, 1.0, 0.2, 0.4)])
    monkeypatch.setattr(e2e, "_metrics", lambda url, timeout=120: next(pages))
    level = e2e.server_split("http://x", lambda: {"concurrency": 8})
    assert level["concurrency"] == 8
    assert level["server_mean_ms"] == pytest.approx({"ttft": 100.0, "queue": 20.0, "prefill": 40.0})  # no decode
    results = {"preset": "p", "date": "d", "device": "g", "vllm": "v", "torch": "t", "engine_args": []}
    samoyeds = _result("samoyeds", {1: 300}, tpot=3.0)
    samoyeds["serving"]["levels"][0]["server_mean_ms"] = level["server_mean_ms"]
    md = markdown({**results, "variants": {"dense": _result("dense, bf16", {1: 235}, tpot=4.0), "samoyeds": samoyeds}})
    assert "| 1 | - | 100.0 = 20.0 + 40.0 + 40.0 |" in md
    assert "mean TTFT by the server" not in markdown({**results, "variants": {"dense": _result("d", {1: 1}, tpot=4)}})


def test_results_measured_with_other_settings_are_set_aside_not_overwritten(tmp_path, monkeypatch, capsys):
    """A second call with other settings (here more requests per client) starts the variant afresh, and the first
    call's results move to OUT/replaced/ instead of being written over; the same settings again resume."""
    from samoyeds_vllm.bench import e2e

    monkeypatch.setattr(e2e, "environment", lambda: {"device": "GPU X", "vllm": "0.26.0", "torch": "2.11.0"})
    monkeypatch.setattr(e2e, "gpu_memory_used", lambda: [])
    monkeypatch.setattr(e2e, "report", lambda out: None)

    def run_variant(variant, model, work, out, progress, result, save, baseline):
        levels = result.setdefault("serving", {"levels": []})["levels"]
        levels += [{"concurrency": c} for c in work.concurrencies]

    monkeypatch.setattr(e2e, "run_variant", run_variant)
    path = tmp_path / "variant-dense.json"
    e2e.bench_e2e("tiny-qwen3_moe", tmp_path, Workload(concurrencies=(1,), prompts_per_client=16), ("dense",))
    first = json.loads(path.read_text())
    capsys.readouterr()
    e2e.bench_e2e("tiny-qwen3_moe", tmp_path, Workload(concurrencies=(16,)), ("dense",))
    [kept] = (tmp_path / "replaced").iterdir()
    assert json.loads(kept.read_text()) == first
    assert "prompts_per_client: 16 -> None" in capsys.readouterr().out
    assert [level["concurrency"] for level in json.loads(path.read_text())["serving"]["levels"]] == [16]
    e2e.bench_e2e("tiny-qwen3_moe", tmp_path, Workload(concurrencies=(64,)), ("dense",))
    assert len(list((tmp_path / "replaced").iterdir())) == 1
    assert [level["concurrency"] for level in json.loads(path.read_text())["serving"]["levels"]] == [16, 64]


@pytest.mark.parametrize(
    "tok_s, median, steady",
    [
        ([105, 100, 103], 103, True),
        ([70, 100, 98], 98, False),  # a stall outvoted by the two rounds that agree; named in the report
        ([100, 108, 92], 100, False),  # rounds that each agree within 10% with the one before them
    ],
)
def test_a_served_level_is_the_median_of_three_timed_rounds(tok_s, median, steady):
    from samoyeds_vllm.bench.e2e import timed_rounds

    seeds, results = [], iter(tok_s)

    def measure(run):
        seeds.append(run)
        return {"concurrency": 256, "output_tokens_per_s": next(results), "run": run}

    def rerun_if_compiled(measure_run):  # compiles nothing: one run per call
        return measure_run(0), {"timed_runs": 1, "jit_compiles": 0, "jit_free": True}

    level = timed_rounds(measure, 100, rerun_if_compiled)
    assert level["output_tokens_per_s"] == median and level["run"] == tok_s.index(median)  # that round's record
    assert level["rounds_output_tokens_per_s"] == [100, *tok_s] and level["steady"] is steady
    assert level["spread"] == pytest.approx(max(tok_s) / min(tok_s) - 1)
    assert level["timed_runs"] == 3 and level["jit_free"] is True
    assert seeds == [0, 1, 2]  # every round its own prompts


def test_a_timed_round_that_compiled_is_made_again_and_counted():
    from samoyeds_vllm.bench.e2e import timed_rounds

    calls = iter([(2, 4, True), (1, 0, True), (3, 5, False)])  # (runs, compiles, jit_free) per round

    def rerun_if_compiled(measure_run):
        runs, compiles, free = next(calls)
        return measure_run(runs - 1), {"timed_runs": runs, "jit_compiles": compiles, "jit_free": free}

    seen = []
    level = timed_rounds(lambda run: seen.append(run) or {"output_tokens_per_s": 50.0 + run}, 100, rerun_if_compiled)
    assert seen == [1, 2, 5]  # each round's last run, numbered after every run before it
    assert level["timed_runs"] == 6 and level["jit_compiles"] == 9 and level["rounds_jit_free"] == [True, True, False]
    assert level["output_tokens_per_s"] == 52.0 and level["jit_free"] is True  # the median round's own


def test_a_timed_round_without_a_throughput_is_no_median_and_no_spread():
    from samoyeds_vllm.bench.e2e import timed_rounds

    results = iter([100.0, None, 90.0])
    level = timed_rounds(
        lambda run: {"output_tokens_per_s": next(results)},
        95.0,
        lambda measure_run: (measure_run(0), {"timed_runs": 1, "jit_compiles": 0, "jit_free": True}),
    )
    assert level["output_tokens_per_s"] == 90.0 and level["spread"] is None and level["steady"] is False


def test_a_served_level_is_warmed_up_again_while_its_untimed_rounds_compile(tmp_path, monkeypatch):
    """Dense FP8's DeepGEMM kept compiling through three timed rounds after a level's untimed one at 256 clients:
    the untimed round is made again (other prompts) while it compiled, at most WARMUP_ROUNDS, and the timed
    rounds come after one that compiled nothing."""
    from samoyeds_vllm.bench import e2e

    log = tmp_path / "engine.log"
    log.write_text("")
    compiles = iter([2, 1, 0, 0, 0, 0])  # two untimed rounds compile, the third does not; then three timed rounds
    served = []

    def bench_serve(server, model, mix, concurrency, requests, out, tag, seed):
        served.append((tag, seed))
        with open(log, "a") as f:
            f.write(JIT_LINE * next(compiles))
        return {"concurrency": concurrency, "output_tokens_per_s": 100.0}

    monkeypatch.setattr(e2e, "bench_serve", bench_serve)
    monkeypatch.setattr(e2e, "server_split", lambda url, measure: measure())
    server = types.SimpleNamespace(url="http://x")
    level = e2e.serve_level(server, tmp_path / "m", (128, 128), 256, 1024, tmp_path, log, [])
    assert served == [
        ("m-c256-warmup", 513),
        ("m-c256-warmup-1", 1513),
        ("m-c256-warmup-2", 2513),
        ("m-c256", 512),
        ("m-c256-1", 1512),
        ("m-c256-2", 2512),
    ]
    assert level["warmup_runs"] == 3 and level["warmup_jit_compiles"] == 3 and level["warmup_jit_free"] is True
    assert level["timed_runs"] == 3 and level["jit_free"] is True and level["steady"] is True
    # a warm-up that never stops compiling ends at WARMUP_ROUNDS, and the record says so
    compiles, served[:] = iter([1] * e2e.WARMUP_ROUNDS + [0] * e2e.TIMED_ROUNDS), []
    level = e2e.serve_level(server, tmp_path / "m", (128, 128), 4, 16, tmp_path, log, [])
    assert len(served) == e2e.WARMUP_ROUNDS + e2e.TIMED_ROUNDS and level["warmup_jit_free"] is False


def test_the_report_names_served_levels_whose_rounds_disagreed():
    samoyeds = _result("samoyeds(V=128), FP8 values", {1: 270}, tpot=3.5)
    samoyeds["serving"]["levels"][0].update(rounds_output_tokens_per_s=[18051.2, 14168.0, 18000.0, 14100.0])
    samoyeds["serving"]["levels"][0]["steady"] = False
    results = {"preset": "p", "date": "d", "device": "g", "vllm": "v", "torch": "t", "engine_args": []}
    text = markdown({**results, "variants": {"samoyeds-fp8": samoyeds}})
    assert (
        "**Served levels whose timed rounds disagreed by more than 10%** (output tok/s, untimed round first): "
        "samoyeds-fp8 1 clients" in text
    )
    assert "(18,051 / 14,168 / 18,000 / 14,100)" in text


def test_the_offline_table_orders_mixes_by_their_token_counts():
    dense = _result("dense, bf16", {1: 235})
    dense["throughput"].append({"input_len": 1024, "output_len": 256, "batch_size": 1, "output_tokens_per_s": 228})
    results = {"preset": "p", "date": "d", "device": "g", "vllm": "v", "torch": "t", "engine_args": []}
    text = markdown({**results, "variants": {"dense": dense}})
    assert text.index("| 128/128 | 1 | 235 |") < text.index("| 1024/256 | 1 | 228 |")


@pytest.mark.parametrize(
    ("visible", "busy"),
    [("0", {"1": 60.0}), ("GPU-a1", {"1": 60.0}), ("GPU-a", {"1": 60.0}), ("0,1", {}), (None, {}), ("MIG-x", {})],
)
def test_other_gpus_in_use_are_those_outside_the_visible_ones(monkeypatch, visible, busy):
    """A job on the machine's other GPU shares its CPUs: two engines side by side on two GPUs, one compiling."""
    if visible is None:  # every GPU may be this run's: nothing to call another job's
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    answer = "0, GPU-a1, 70000\n1, GPU-b2, 61440\n2, GPU-c3, 500\n"  # GPU 2's 0.5 GiB: a context, not a job
    monkeypatch.setattr(vllm_server, "nvidia_smi", lambda query, *formats, gpus=None: answer)
    assert vllm_server.other_gpus_in_use() == busy


def test_the_report_says_when_other_gpus_of_the_host_were_in_use(monkeypatch):
    from samoyeds_vllm.bench import e2e

    dense = _result("dense, bf16", {1: 235, 16: 1227})
    first, second = dense["throughput"]
    monkeypatch.setattr(e2e, "other_gpus_in_use", lambda: {"1": 20.5})
    e2e.note_shared_host(dense, [first])
    monkeypatch.setattr(e2e, "other_gpus_in_use", lambda: {"1": 60.0})
    e2e.note_shared_host(dense, [])
    monkeypatch.setattr(e2e, "other_gpus_in_use", dict)
    e2e.note_shared_host(dense, [second])
    assert dense["other_gpus_in_use"] == {"1": 60.0}  # the most seen
    assert first["other_gpus_in_use"] == {"1": 20.5} and "other_gpus_in_use" not in second
    results = {"preset": "p", "date": "d", "device": "g", "vllm": "v", "torch": "t", "engine_args": []}
    text = markdown({**results, "variants": {"dense": dense, "samoyeds": _result("samoyeds(V=128), bf16", {1: 266})}})
    assert "**Other GPUs of the host were in use** while these ran (dense: GPU 1: 60.0 GiB)" in text
    assert "Other GPUs" not in markdown({**results, "variants": {"samoyeds": _result("samoyeds", {1: 266})}})


def test_each_point_is_marked_by_what_was_seen_while_it_ran(monkeypatch):
    """A neighbour that starts or stops in the middle of a mix: the offline rows keep what the engine's process saw
    around each timed run, not what is seen when the mix ends; a served level gets what was seen before and after."""
    from samoyeds_vllm.bench import e2e

    dense = _result("dense, bf16", {1: 235, 16: 1227, 64: 3400})
    alone, beside, gone = dense["throughput"]
    alone["other_gpus_in_use"], beside["other_gpus_in_use"] = {}, {"1": 30.0}
    monkeypatch.setattr(e2e, "other_gpus_in_use", lambda: {"1": 60.0})  # the neighbour, there when the mix ends
    e2e.note_shared_host(dense, [alone, beside])
    assert "other_gpus_in_use" not in alone and beside["other_gpus_in_use"] == {"1": 30.0}
    assert dense["other_gpus_in_use"] == {"1": 30.0}  # what the rows saw, not the look after the engine ended
    level = {"concurrency": 16}
    monkeypatch.setattr(e2e, "other_gpus_in_use", dict)  # gone by the end of the level
    e2e.note_shared_host(dense, [level], before={"0": 12.0, "1": 40.0})
    assert level["other_gpus_in_use"] == {"0": 12.0, "1": 40.0}
    assert dense["other_gpus_in_use"] == {"1": 40.0, "0": 12.0}
    e2e.note_shared_host(dense, [gone], before={})
    assert "other_gpus_in_use" not in gone


@pytest.mark.parametrize(
    "capacity, queues, seen, probed, most",
    [
        (320, False, {}, [304, 334], 304),  # clean at the estimate, preempted above: two probes
        (290, False, {}, [273, 304], 273),  # preempted at the estimate: downwards to a clean load
        (200, False, {}, [152, 228, 273, 304], 152),
        (500, False, {}, [304, 334, 380], 380),  # every load fits: upwards to the last
        (320, True, {}, [304, 334, 380], 320),  # the engine queued what did not fit: that peak, seen twice
        (300, True, {304: 290}, [304, 334, 380], 300),  # one late sample below the capacity does not end the search
        (300, True, {304: 0}, [304, 334, 380], 300),  # nor does a load the poller saw nothing of
        (320, False, {304: 0}, [273, 304, 334], 273),  # ... nor does it stand for a clean load below a preempting one
    ],
)
def test_capacity_probes_go_outwards_from_the_estimate(monkeypatch, capacity, queues, seen, probed, most):
    """Loads from 0.5 to 1.25 x an estimate of 304.1 sequences (152 ... 380); a load above `capacity` preempts,
    or, when the engine `queues`, runs `capacity` at once without preempting; the poller saw the peaks `seen` of
    some loads (0: nothing running) instead. Loads below a clean one are not run."""
    from samoyeds_vllm.bench import e2e

    offered = []

    class Poller:
        def __init__(self, url):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            load = offered[-1]
            self.peak_running = float(seen.get(load, min(load, capacity)))
            self.preemptions = 1.0 if load > capacity and not queues else 0.0

    monkeypatch.setattr(e2e, "_MetricsPoller", Poller)
    monkeypatch.setattr(e2e, "bench_serve", lambda server, model, mix, c, n, out, tag, seed: offered.append(c))
    server, saves, measured = types.SimpleNamespace(url="http://x"), [], {}
    e2e.measure_max_seqs(server, None, 4096, 304.1, None, "m", e2e.PROBE_FACTORS, measured, lambda: saves.append(1))
    assert sorted(offered) == probed and [p["concurrency"] for p in measured["probes"]] == probed
    assert measured["max_seqs_without_preemption"] == most and measured["saturated"] == queues
    assert len(saves) == len(probed) + 1  # each probe as it finished, then the result

    offered.clear()  # a run cut short resumes: what was probed is not probed again
    del measured["max_seqs_without_preemption"]
    e2e.measure_max_seqs(server, None, 4096, 304.1, None, "m", e2e.PROBE_FACTORS, measured, lambda: None)
    assert offered == [] and measured["max_seqs_without_preemption"] == most


def test_no_capacity_estimate_is_an_error_not_a_probe():
    from samoyeds_vllm.bench import e2e

    with pytest.raises(SamoyedsError, match="no capacity estimate"):
        e2e.measure_max_seqs(None, None, 4096, 0.0, None, "m", e2e.PROBE_FACTORS, {}, lambda: None)


@pytest.mark.parametrize("harness", [4, 5])
def test_the_report_says_how_a_served_level_was_timed(harness):
    """Harness 5 keeps the median of three timed rounds; a report of an older run still says what it did."""
    samoyeds = _result("samoyeds(V=128), FP8 values", {1: 270}, tpot=3.5)
    results = {"preset": "p", "date": "d", "device": "g", "vllm": "v", "torch": "t", "engine_args": []}
    text = markdown({**results, "harness": harness, "api_servers": 4, "variants": {"samoyeds-fp8": samoyeds}})
    assert "Served through 4 API server processes (`--api-server-count 4`)" in text
    median = "untimed round of as many; each level the median of three timed rounds (harness 5)."
    assert (median in text) is (harness == 5)
    assert harness == 5 or "untimed round of as many." in text


@pytest.mark.parametrize("device, hint", [("CPU: x", "dense not measured"), ("GPU X", "dense, dense-fp8 not measured")])
def test_the_report_suggests_only_variants_the_device_runs(tmp_path, monkeypatch, capsys, device, hint):
    """From a walk: a CPU run's report suggested `--variants dense,dense-fp8,...`, and dense-fp8 needs a GPU."""
    from samoyeds_vllm.bench import e2e

    monkeypatch.setattr(e2e, "environment", lambda: {"device": device, "vllm": "0.26.0", "torch": "2.11.0"})
    monkeypatch.setattr(e2e, "gpu_memory_used", lambda: [])
    monkeypatch.setattr(e2e, "run_variant", lambda variant, model, work, out, *rest: None)
    for variant in ("samoyeds", "samoyeds-fp8"):
        e2e.bench_e2e("tiny-qwen3_moe", tmp_path, Workload(concurrencies=(1,)), (variant,))
    out = capsys.readouterr().out
    assert f"{hint} in {tmp_path}" in out, out
