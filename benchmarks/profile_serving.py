"""Where the time of a served load goes, dense and sparse: the engine's prefill steps, its decode steps, and the
stretches its GPU waits with nothing to run (the turn-around between waves of requests).

    python benchmarks/profile_serving.py --preset qwen3-30b-a3b --variants dense-fp8,samoyeds-fp8 \
        --concurrency 256 --waves 2 --out DIR [--mix 128:128] [--api-servers 4] [--engine-args "..."]

Each variant is served as `bench e2e` serves it (its config-only model with dummy weights, its environment, the same
engine and server flags, API server processes), plus vLLM's torch profiler (`--profiler-config`). Through one client
process (tools.serve_client) it takes C x WAVES requests of the mix at C clients (`vllm bench serve --ignore-eos`:
every request as long, so with fixed lengths they start and end together, in waves of C), first untimed (again while
a load compiled a kernel, at most WARMUP_ROUNDS loads, as bench e2e does), then again (other prompts) with
`--profile`, which has the server start the engine's profiler before the requests and stop it after them (kernels
compiled meanwhile: `jit_compiles`). From that trace (bench/trace.py): each engine step on the GPU's clock, from its
start to the next step's, split into its kernels' time (GPU busy, by category) and the rest; steps that prefill
(with decodes or without) and steps that only decode summed apart; and every stretch of IDLE_MS or more with no
kernel running, which a decode or prefill step never has but the engine waiting for requests does. The profiled
load's client-side results (duration, TTFT, ITL; `--save-detailed`: per request) come from its JSON. The profiler
slows the engine's host side: the untimed load's duration beside the profiled one's says by how much.

Writes DIR/profile-serving.json (per variant, totals and per wave) and prints a table; the traces stay in
DIR/trace-VARIANT. On a CPU there are no GPU kernels: durations only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from samoyeds_vllm.bench.e2e import (
    API_SERVERS,
    VARIANTS,
    WARMUP_ROUNDS,
    Workload,
    bench_serve,
    engine_tensor_parallel_size,
    variant_env,
    watched_jit_caches,
)
from samoyeds_vllm.bench.trace import Kernels, busy_time, by_category, gap_spans, kernel_times, read_trace
from samoyeds_vllm.tools.serve_client import BenchServeClient
from samoyeds_vllm.tools.vllm_server import VllmServer, gpu_memory_used, wait_for_gpu_memory, without_jit

DEFAULT_VARIANTS = ("dense-fp8", "samoyeds-fp8")
#: A stretch with no kernel running this long is the engine waiting for requests, not a step: the longest step of
#: the served runs (a prefill of 8192 tokens, Qwen3-30B-A3B on an H200) took ~100 ms, all of it kernels, and the GPU
#: gaps inside steps are microseconds.
IDLE_MS = 5.0
#: Seeds of the loads (`vllm bench serve --seed`): the untimed ones (each rerun + RERUN_SEED), the profiled one.
SEEDS = (7, 8)
RERUN_SEED = 1000
KINDS = ("prefill", "decode")  # of engine steps: any prefill request, or decodes only


def step_split(trace, idle_ms: float = IDLE_MS) -> dict:
    """The engine steps of a trace (bench/trace.Trace) by kind, "prefill" (any prefill request) or "decode": their
    count, their windows' ms (each step from its start to the next step's start; the last to the trace's last
    kernel end), less every GPU idle stretch of `idle_ms` or more inside them, which is counted apart ("idle");
    their kernels' ms (GPU busy) and by category. `span_ms`: first step start to last kernel end."""
    kernels, steps = trace.kernels, trace.steps
    empty = {"steps": 0, "window_ms": 0.0, "busy_ms": 0.0, "kernel_ms": {}}
    if not steps or not kernels:
        idle = {"count": 0, "ms": 0.0, "largest_ms": [], "mean_ms": 0.0}
        return {"prefill": dict(empty), "decode": dict(empty), "idle": idle, "span_ms": 0.0}
    last_end = max(start + dur for _, start, dur in kernels)
    edges = [start for start, _, _ in steps] + [max(last_end, steps[-1][0])]
    # stretches within the steps' span only (before the first step the profiler waits for the load's requests), so
    # the windows and the idle time add up to the span
    clipped = [(max(a, edges[0]), min(b, edges[-1])) for a, b, _, _ in gap_spans(kernels)]
    idle_spans = [(a, b) for a, b in clipped if b - a >= idle_ms * 1e3]
    sorted_kernels = Kernels(kernels)
    totals = {kind: {"steps": 0, "window_us": 0.0, "busy_us": 0.0, "times": defaultdict(float)} for kind in KINDS}
    for (start, prefills, _), end in zip(steps, edges[1:], strict=True):
        kind = totals["prefill" if prefills else "decode"]
        cut = sorted_kernels.window(start, end)
        kind["steps"] += 1
        kind["window_us"] += end - start - _overlap(idle_spans, start, end)
        kind["busy_us"] += busy_time(cut)
        for name, us in kernel_times(cut).items():
            kind["times"][name] += us
    split = {
        name: {
            "steps": t["steps"],
            "window_ms": t["window_us"] / 1e3,
            "busy_ms": t["busy_us"] / 1e3,
            "kernel_ms": {k: us / 1e3 for k, us in sorted(by_category(t["times"]).items())},
        }
        for name, t in totals.items()
    }
    idle = sorted((b - a for a, b in idle_spans), reverse=True)
    split["idle"] = {
        "count": len(idle),
        "ms": sum(idle) / 1e3,
        "mean_ms": sum(idle) / len(idle) / 1e3 if idle else 0.0,  # one turn-around between two waves
        "largest_ms": [us / 1e3 for us in idle[:8]],
    }
    split["span_ms"] = (edges[-1] - steps[0][0]) / 1e3
    return split


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def client_summary(result: dict, waves: int) -> dict:
    """What the client measured in one load (`vllm bench serve`'s JSON), with its duration per wave and, from the
    per-request lists `--save-detailed` keeps, the median inter-token gap."""
    itls = [gap for request in result.get("itls") or [] for gap in request]
    return {
        "duration_s": result.get("duration"),
        "wave_s": result["duration"] / waves if result.get("duration") else None,
        "output_tokens_per_s": result.get("output_throughput"),
        "mean_ttft_ms": result.get("mean_ttft_ms"),
        "median_itl_ms": 1e3 * statistics.median(itls) if itls else result.get("median_itl_ms"),
        "completed": result.get("completed"),
    }


def profile_variant(name: str, args: argparse.Namespace, out: Path, baseline) -> dict:
    """One variant's server, its untimed load, then its profiled load; the record."""
    variant = VARIANTS[name]
    model = variant.model(args.preset, args.segment, out / "models" / name)
    trace_dir = (out / f"trace-{name}").resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob("*.json*"):
        old.unlink()
    profiler = {"profiler": "torch", "torch_profiler_dir": str(trace_dir), "torch_profiler_with_stack": False}
    work = Workload(engine_args=tuple(shlex.split(args.engine_args)), api_servers=args.api_servers)
    server_args = [*work.server_args(variant), "--profiler-config", json.dumps(profiler)]
    log, caches = out / f"server-{name}.log", watched_jit_caches(variant, variant_env(variant))

    def load(kind: str, seed: int, *extra: str) -> dict:
        tag = f"{name}-{kind}"
        bench_serve(client, model, args.mix, args.concurrency, args.concurrency * args.waves, out, tag, seed, extra)
        return json.loads((out / f"serve-{tag}.json").read_text())

    wait_for_gpu_memory(baseline)
    with VllmServer(model, server_args, log_path=log, env=dict(variant.env)) as server:
        with BenchServeClient(server.url, out / f"client-{name}.log") as client:
            # untimed until a load compiles no kernel (bench e2e's rule): a compile in the profiled load would show
            # as a stretch of idle GPU
            untimed, warmup = without_jit(
                lambda run: load(
                    "untimed" + (f"-{run}" if run else ""), SEEDS[0] + RERUN_SEED * run, "--save-detailed"
                ),
                log,
                attempts=WARMUP_ROUNDS,
                caches=caches,
            )
            profiled, during = without_jit(
                lambda run: load("profiled", SEEDS[1], "--save-detailed", "--profile"), log, attempts=1, caches=caches
            )
            # the workers write their traces after the profile stops: wait for them before the server ends
            _wait_for_traces(trace_dir)
    split = step_split(read_trace(trace_dir))
    return {
        "model": variant.model.describe(args.segment),
        "server_args": server_args,
        "untimed": client_summary(untimed, args.waves) | {"runs": warmup["timed_runs"], "jit_free": warmup["jit_free"]},
        "profiled": client_summary(profiled, args.waves) | {"jit_compiles": during["jit_compiles"]},
        "engine": split,
        "per_wave": _per_wave(split, args.waves),
    }


def _wait_for_traces(trace_dir: Path, timeout: float = 300.0) -> None:
    """Until the profiler's trace files in `trace_dir` exist and stop growing."""
    deadline, sizes = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        now = {p: p.stat().st_size for p in trace_dir.glob("*.json*")}
        if now and now == sizes:
            return
        sizes = now
        time.sleep(2.0)
    raise SystemExit(f"no profiler trace settled in {trace_dir} within {timeout:.0f} s")


def _per_wave(split: dict, waves: int) -> dict:
    """The engine's ms per wave: prefill and decode steps' windows and busy time, and its idle time."""
    record = {f"{kind}_{key}": split[kind][key] / waves for kind in KINDS for key in ("window_ms", "busy_ms")}
    record["idle_ms"] = split["idle"]["ms"] / waves
    return record


def table(results: dict, waves: int) -> str:
    """A line per variant: the client's seconds per wave (untimed, profiled) and the engine's per wave."""
    head = (
        f"{'variant':>14} {'wave s':>7} {'profiled':>8} {'prefill':>16} {'decode':>16} {'GPU idle':>9} {'each':>6}"
        "  (per wave; prefill / decode: steps, ms of their windows, ms of kernels; GPU idle: ms per wave, each: ms"
        " per idle stretch)"
    )
    lines = [head]
    for name, r in results.items():
        e = r["engine"]

        def cell(kind: str, e=e) -> str:
            k = e[kind]
            return f"{k['steps'] / waves:.0f} {k['window_ms'] / waves:.0f} {k['busy_ms'] / waves:.0f}"

        wave = r["untimed"]["wave_s"] or float("nan")
        profiled = r["profiled"]["wave_s"] or float("nan")
        lines.append(
            f"{name:>14} {wave:>7.3f} {profiled:>8.3f} {cell('prefill'):>16} {cell('decode'):>16} "
            f"{e['idle']['ms'] / waves:>9.0f} {e['idle']['mean_ms']:>6.0f}"
        )
    if not any(r["engine"]["prefill"]["steps"] + r["engine"]["decode"]["steps"] for r in results.values()):
        lines.append("no engine steps in the traces (a CPU run?): client times only")
    return "\n".join(lines)


def parse_mix(text: str) -> tuple[int, int]:
    inp, sep, outp = text.partition(":")
    if not sep or not inp.isdigit() or not outp.isdigit():
        raise argparse.ArgumentTypeError(f"a mix is INPUT:OUTPUT tokens (e.g. 128:128), not {text!r}")
    return int(inp), int(outp)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--segment", type=int, default=None, help="samoyeds segment size V of the samoyeds variants")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--concurrency", type=int, default=256, help="clients, and requests per wave")
    parser.add_argument("--waves", type=int, default=2, help="requests per client in each load")
    parser.add_argument("--mix", type=parse_mix, default=(128, 128), help="INPUT:OUTPUT tokens per request")
    parser.add_argument("--api-servers", type=int, default=API_SERVERS)
    parser.add_argument("--engine-args", default="", help="more engine flags, as one string")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        sys.exit(f"unknown variants {', '.join(unknown)}; choose of {', '.join(VARIANTS)}")
    if args.concurrency < 1 or args.waves < 1:
        sys.exit("--concurrency and --waves must be at least 1")
    if (engine_tensor_parallel_size(shlex.split(args.engine_args)) or 1) > 1:
        sys.exit("one GPU only: every rank writes its own trace, and their steps would be counted once per rank")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    baseline = gpu_memory_used()
    results = {name: profile_variant(name, args, out, baseline) for name in variants}
    record = {
        "preset": args.preset,
        "mix": list(args.mix),
        "concurrency": args.concurrency,
        "waves": args.waves,
        "api_servers": args.api_servers,
        "idle_ms": IDLE_MS,
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    (out / "profile-serving.json").write_text(json.dumps(record, indent=2) + "\n")
    print(table(results, args.waves))


if __name__ == "__main__":
    main()
