"""Where the GPU time of a generated token goes in vLLM, dense and sparse, bf16 and FP8: MoE, attention, GEMMs, rest.

    python benchmarks/profile_decode.py --preset qwen3-30b-a3b --batch 1,16 --out DIR \
        [--variants dense,dense-fp8,samoyeds,samoyeds-fp8] [--prompt-len 8] [--cached-prompts]

Each variant is one of `bench e2e`'s (its config-only model, dummy weights, and the environment its processes get)
and runs in its own process: vLLM as served (CUDA graphs; --enforce-eager to compare) generates --steps tokens for
each batch of --prompt-len-token prompts, first untimed (so JIT compilation and first-use costs fall there), then
under vLLM's torch profiler. With the default 8-token prompts the profiled steps are decodes; with 1024-token ones
at a batch of 256 they are mostly that prefill, in steps of vLLM's default batched-token budget (16384 in `LLM` on
an H200, vLLM 0.26), as `bench e2e`'s 1024:256 mix starts. With --cached-prompts the profiled run finds its prompts
in the prefix cache the untimed run filled (while the KV cache holds them; `cached_prompt_tokens` says how many
hit): vLLM still recomputes each prompt's last block (a hit covers whole blocks and never a prompt's last token), in
one or two short prefill steps, and the rest are decodes at that context; more --steps dilute those. The GPU time of
each trace is split among its kernels (where kernels overlap, as dependent launches do, each instant goes to the
earliest-started one: kernel_times), summed by category (kernel-name patterns: samoyeds_vllm/bench/trace.py) and
divided by the tokens generated per sequence (any prefill included; the JSON's `*_per_step` keys, kept for older
results, mean per generated token); the wall time is measured around generate, and the GPU idle time is what of it
no kernel covers (host work between kernels and steps, and generate's own: adding the requests, finishing the
outputs). The steady decode steps are also measured alone ("decode" rows, `decode_steps`): vLLM names each engine
step in the trace, and from the GPU start of one step that decodes the whole batch to the start of the next are its
wall and kernel times, averaged over the run's such steps (so the prompts' prefill and the run's start and end drop
out; the median wall too). A profiled run with a GPU gap of a second or more (a kernel compiled on first use) is
profiled again, three runs at most. Writes DIR/profile-decode.json and DIR/profile-decode.png (a bar per row of the
table, split so), keeps the traces in DIR/trace-VARIANT-bBATCH, and prints a table. On a CPU there are no GPU
kernels: only wall times.

    python benchmarks/profile_decode.py --out DIR --replot     # the table and plot again from DIR's JSON
    python benchmarks/profile_decode.py --out DIR --reread     # the decode steps again from DIR's traces, then that
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from samoyeds_vllm.bench.e2e import VARIANTS, variant_env
from samoyeds_vllm.bench.trace import (
    CATEGORIES,
    Kernels,
    busy_time,
    by_category,
    category,
    kernel_spans,
    kernel_times,
    largest_gaps,
    read_trace,
)

DEFAULT_VARIANTS = ("dense", "dense-fp8", "samoyeds", "samoyeds-fp8")

TOP_KERNELS = 15  # the slowest kernels of a trace are kept by name, to check the categories
# A GPU gap this long in a profiled run is a kernel compiled on first use (DeepGEMM's nvcc for a token count the
# untimed run did not schedule, Triton), not the steady state: that run is profiled again, at most PROFILE_ATTEMPTS
# times in all.
STALL_US = 1e6
PROFILE_ATTEMPTS = 3


def _prompt(index: int, length: int) -> list[int]:
    """Prompt `index` of a batch: token ids in 10..1009 whose first two name the index, so no two prompts of up to a
    million share a prefix-cache block."""
    ids = [(7 * index + j) % 1000 + 10 for j in range(length)]
    ids[:2] = [10 + index % 1000, 10 + index // 1000 % 1000][:length]
    return ids


def stalled_on_a_compile(gaps: list[dict]) -> bool:
    """Whether a trace's longest GPU gap (largest_gaps) is STALL_US or more: a kernel compiled on first use."""
    return bool(gaps) and gaps[0]["us"] >= STALL_US


def decode_steps(
    kernels: list[tuple[str, float, float]], steps: list[tuple[float, int, int]], batch: int
) -> dict | None:
    """The steady decode steps of a profiled run: each window from the GPU start of a step (Trace.steps) that decodes
    the whole batch and prefills nothing to the start of the next such step, when that one follows it directly; per
    window its wall time (the step's kernels, the sampling after them, and the GPU's wait for the next step) and its
    kernels' time by category (a kernel cut at the window's edges) and of its TOP_KERNELS slowest kernels by name,
    averaged over the windows (`windows`: one per step measured). None when the trace has no two such steps in a row
    (a CPU run, a run of too few tokens)."""
    windows = [
        (start, end)
        for (start, *kind), (end, *next_kind) in itertools.pairwise(steps)
        if kind == next_kind == [0, batch]
    ]
    if not windows:
        return None
    sorted_kernels = Kernels(kernels)
    busy, times = 0.0, defaultdict(float)
    for start, end in windows:
        cut = sorted_kernels.window(start, end)
        busy += busy_time(cut)
        for name, us in kernel_times(cut).items():
            times[name] += us
    count, top = len(windows), sorted(times.items(), key=lambda item: -item[1])[:TOP_KERNELS]
    return {
        "windows": count,
        "wall_ms": sum(end - start for start, end in windows) / count / 1e3,
        "median_wall_ms": statistics.median(end - start for start, end in windows) / 1e3,  # the first steps can lag
        "gpu_busy_ms": busy / count / 1e3,
        "kernel_ms": {name: us / count / 1e3 for name, us in sorted(by_category(times).items())},
        "top_kernels_us": [{"name": name[:160], "category": category(name), "us": us / count} for name, us in top],
    }


def traces_of(out: Path, variant: str, batch: int | str) -> Path:
    """Where the traces of a variant's profiled run at `batch` are kept."""
    return out / f"trace-{variant}-b{batch}"


def _write_json(path: Path, record: dict) -> None:
    """Writes `record` to `path` whole or not at all (an interrupted write leaves the old file)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(part, path)


def _new_traces(trace_root: Path, seen: set[Path], into: Path, wait_s: float = 60.0) -> None:
    """Moves the trace files the last profile wrote into `into` (the workers may still be writing them)."""
    deadline = time.monotonic() + wait_s
    while not (new := set(trace_root.glob("*.json*")) - seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    into.mkdir(parents=True, exist_ok=True)
    for path in new:
        path.rename(into / path.name)


def profile_variant(
    model: Path, batches: list[int], steps: int, prompt_len: int, cached_prompts: bool, out: Path, engine_args: dict
) -> dict:
    """One engine (run in its own process): for each batch, `steps` tokens for `batch` sequences of `prompt_len`
    prompt tokens, untimed, then timed under the profiler; with `cached_prompts` the timed run finds its prompts in
    the prefix cache the untimed one filled, so its steps are decodes at that context after one or two short steps
    that recompute each prompt's last block."""
    from vllm import LLM, SamplingParams

    trace_root = (out / f"trace-{model.name}").resolve()
    llm = LLM(
        str(model),
        load_format="dummy",
        max_num_seqs=max(batches),
        **engine_args,
        profiler_config={
            "profiler": "torch",
            "torch_profiler_dir": str(trace_root),
            "torch_profiler_with_stack": False,
        },
    )
    params = SamplingParams(max_tokens=steps, ignore_eos=True, temperature=0.0)
    results = {}
    for batch in batches:
        prompts = [{"prompt_token_ids": _prompt(i, prompt_len)} for i in range(batch)]
        if not cached_prompts:  # the last batch's prompts begin these: the warm-up would skip part of their prefill
            llm.reset_prefix_cache()
        llm.generate(prompts, params, use_tqdm=False)  # warm-up: same shapes, so JIT compiles fall here
        runs = 0
        while True:
            runs += 1
            if not cached_prompts:
                llm.reset_prefix_cache()
            seen = set(trace_root.glob("*.json*"))
            llm.start_profile()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - start
            llm.stop_profile()
            traces = traces_of(out, model.name, batch)
            shutil.rmtree(traces, ignore_errors=True)  # a stalled run's traces
            _new_traces(trace_root, seen, traces)
            trace = read_trace(traces)
            kernels = trace.kernels
            gaps = largest_gaps(kernels)
            stalled = stalled_on_a_compile(gaps)
            if not stalled or runs == PROFILE_ATTEMPTS:
                break
        times, spans = kernel_times(kernels), kernel_spans(kernels)
        top = sorted(times.items(), key=lambda item: -item[1])[:TOP_KERNELS]
        results[batch] = {
            "wall_ms_per_step": 1e3 * wall / steps,
            "profiled_runs": runs,
            "stalled": stalled,  # every profiled run had a gap of STALL_US or more: its wall and idle times include it
            "cached_prompt_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
            "gpu_busy_ms_per_step": busy_time(kernels) / 1e3 / steps,
            "kernel_ms_per_step": {k: v / 1e3 / steps for k, v in sorted(by_category(times).items())},
            "decode_steps": decode_steps(kernels, trace.steps, batch),  # ms per step: a token a sequence
            "largest_gpu_gaps": gaps,
            "top_kernels_us_per_step": [
                {"name": name[:160], "category": category(name), "us": us / steps, "span_us": spans[name] / steps}
                for name, us in top
            ],
        }
    return results


class Row(NamedTuple):
    """A bar of the plot and a line of the table: ms per generated token of a sequence."""

    label: str
    batch: str
    wall_ms: float
    gpu_busy_ms: float
    kernel_ms: dict
    stalled: bool


def rows(results: dict) -> list[Row]:
    """Per variant and batch the whole profiled run, then, where the trace has them, its steady decode steps
    (decode_steps; a decode step gives each sequence a token, so ms per step is ms per generated token)."""
    out = []
    for variant, per_batch in results.items():
        for batch, r in per_batch.items():
            stalled = r.get("stalled", False)
            out.append(
                Row(
                    variant,
                    str(batch),
                    r["wall_ms_per_step"],
                    r["gpu_busy_ms_per_step"],
                    r["kernel_ms_per_step"],
                    stalled,
                )
            )
            if steady := r.get("decode_steps"):  # a compile's gap may fall in a window too: marked the same
                out.append(
                    Row(
                        f"{variant} decode",
                        str(batch),
                        steady["wall_ms"],
                        steady["gpu_busy_ms"],
                        steady["kernel_ms"],
                        stalled,
                    )
                )
    return out


def table(results: dict) -> str:
    names = [name for name, _ in CATEGORIES] + ["other"]
    lines_of = rows(results)
    width = max([len("variant")] + [len(row.label) for row in lines_of])
    lines = [
        f"{'variant':>{width}} {'batch':>5} {'wall ms':>8} {'GPU idle':>8} "
        + " ".join(f"{n:>9}" for n in names)
        + f" {'kernels':>8}  (ms per generated token of a sequence)"
    ]
    for row in lines_of:
        k = row.kernel_ms
        idle = row.wall_ms - row.gpu_busy_ms if k else float("nan")
        lines.append(
            f"{row.label:>{width}} {row.batch:>5} {row.wall_ms:>8.2f} {idle:>8.2f} "
            + " ".join(f"{k.get(n, 0.0):>9.2f}" for n in names)
            + f" {sum(k.values()):>8.2f}"
            + ("  * stalled" if row.stalled else "")
        )
    if any(r.get("decode_steps") for per_batch in results.values() for r in per_batch.values()):
        lines.append(
            "'decode': the profiled run's steady decode steps alone (each from the GPU start of a step decoding the"
            " whole batch to the start of the next; the prompts' prefill steps and the run's start and end left out)"
        )
    if any(r.get("stalled") for per_batch in results.values() for r in per_batch.values()):
        lines.append(
            f"* every profiled run had a GPU gap of {STALL_US / 1e6:.0f} s or more (a kernel compiled on first use):"
            " its wall and idle times include it, its kernel times do not"
        )
    if not any(r["kernel_ms_per_step"] for per_batch in results.values() for r in per_batch.values()):
        lines.append("no GPU kernels in the traces (a CPU run?): wall times only")
    return "\n".join(lines)


def plot(record: dict, path: Path) -> None:
    """A panel per batch size, a bar per row (rows: each variant's run, and its decode steps where measured): ms per
    generated token split into the kernel categories and the GPU's idle time (nothing without matplotlib, or without
    GPU kernels in the traces)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    results = record["results"]
    batches = sorted({int(b) for per_batch in results.values() for b in per_batch})
    if not any(r["kernel_ms_per_step"] for per_batch in results.values() for r in per_batch.values()):
        return
    parts = {"moe": "MoE", "attention": "attention", "gemm": "other GEMMs", "other": "rest", "idle": "GPU idle"}
    every_row = rows(results)
    panels = {batch: [row for row in every_row if row.batch == str(batch)] for batch in batches}
    tallest = max(len(panel) for panel in panels.values())
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 0.6 * tallest + 1.6), squeeze=False)
    for ax, (batch, panel) in zip(axes[0], panels.items(), strict=True):
        left = [0.0] * len(panel)
        for part, label in parts.items():
            widths = [
                row.wall_ms - row.gpu_busy_ms if part == "idle" else row.kernel_ms.get(part, 0.0) for row in panel
            ]
            ax.barh([row.label for row in panel], widths, left=left, label=label)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.invert_yaxis()
        ax.set_xlabel("ms per generated token of a sequence")
        ax.set_title(f"batch {batch}")
    # below the panels, where no bar can be under it
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=len(parts), fontsize=8)
    prompt = f"{record.get('prompt_len', 8)}-token prompts{' (cached)' if record.get('cached_prompts') else ''}"
    fig.suptitle(f"{record['preset']}, {prompt}: GPU time by kind ({record['date']})", fontsize=10)
    fig.tight_layout(rect=(0, 0.3 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reread(record: dict, out: Path) -> None:
    """Each result's decode steps again from its traces kept in `out`; every result's traces are checked first."""
    runs = [
        (variant, batch, result)
        for variant, per_batch in record["results"].items()
        for batch, result in per_batch.items()
    ]
    if missing := [str(traces_of(out, v, b)) for v, b, _ in runs if not traces_of(out, v, b).is_dir()]:
        sys.exit(f"no traces in {', '.join(missing)}")
    for variant, batch, result in runs:
        result["decode_steps"] = decode_steps(*read_trace(traces_of(out, variant, batch)), int(batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--segment", type=int, default=None, help="samoyeds segment size V of the samoyeds variants")
    parser.add_argument("--batch", default="1,16", help="concurrent sequences, comma-separated")
    parser.add_argument("--steps", type=int, default=64, help="tokens generated per sequence")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--prompt-len", type=int, default=8, help="prompt tokens per sequence")
    parser.add_argument(
        "--cached-prompts",
        action="store_true",
        help="keep the untimed run's prompts in the prefix cache: the profiled steps are decodes at --prompt-len "
        "tokens of context after one or two steps recomputing each prompt's last block, not that prefill",
    )
    parser.add_argument("--max-model-len", type=int, default=None, help="default: max(1024, prompt + steps)")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--replot", action="store_true", help="only the table and plot of OUT/profile-decode.json")
    parser.add_argument(
        "--reread",
        action="store_true",
        help="the steady decode steps of OUT/profile-decode.json again from the traces kept in OUT, then --replot",
    )
    parser.add_argument("--worker", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    if args.replot or args.reread:
        record = json.loads((out / "profile-decode.json").read_text())
        if args.reread:
            reread(record, out)
            _write_json(out / "profile-decode.json", record)
        print(table(record["results"]))
        plot(record, out / "profile-decode.png")
        return
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batch.split(",")]
    max_model_len = max(1024, args.prompt_len + args.steps) if args.max_model_len is None else args.max_model_len
    if max_model_len < args.prompt_len + args.steps:
        sys.exit(f"--max-model-len {max_model_len} is shorter than --prompt-len + --steps")
    engine_args = {"max_model_len": max_model_len, "enforce_eager": args.enforce_eager}
    if args.cached_prompts:  # what the flag relies on, whatever the default
        engine_args["enable_prefix_caching"] = True
    if args.worker:  # one engine: print its result as JSON on the last line
        result = profile_variant(
            Path(args.worker), batches, args.steps, args.prompt_len, args.cached_prompts, out, engine_args
        )
        print(json.dumps(result))
        sys.stdout.flush()
        os._exit(0)  # vLLM's engine processes can keep the interpreter alive
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        sys.exit(f"unknown variants {', '.join(unknown)}; choose of {', '.join(VARIANTS)}")
    results: dict = {}
    for name in variants:
        variant = VARIANTS[name]
        model = variant.model(args.preset, args.segment, out / "models" / name)
        command = [sys.executable, __file__, "--worker", str(model), "--out", str(out), "--batch", args.batch]
        command += ["--steps", str(args.steps), "--prompt-len", str(args.prompt_len)]
        command += ["--cached-prompts"] if args.cached_prompts else []
        command += ["--max-model-len", str(max_model_len)]
        command += ["--enforce-eager"] if args.enforce_eager else []
        log = out / f"profile-{name}.log"
        with open(log, "w") as f:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=f, text=True, env=variant_env(variant))
        if done.returncode != 0:
            sys.exit(f"{name} failed (exit {done.returncode}); see {log}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    record = {
        "preset": args.preset,
        "variants": {name: VARIANTS[name].model.describe(args.segment) for name in variants},
        "steps": args.steps,
        "prompt_len": args.prompt_len,
        "cached_prompts": args.cached_prompts,
        "enforce_eager": args.enforce_eager,
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    _write_json(out / "profile-decode.json", record)
    print(table(results))
    plot(record, out / "profile-decode.png")


if __name__ == "__main__":
    main()
