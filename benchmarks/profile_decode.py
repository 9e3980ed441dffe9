"""Where a decode step's GPU time goes in vLLM, dense vs samoyeds: MoE, attention, other GEMMs, the rest.

    python benchmarks/profile_decode.py --preset qwen3-30b-a3b --pattern samoyeds --batch 1,16 --out DIR

Each variant (the config-only models of `bench e2e`, dummy weights) runs in its own process: vLLM as served
(CUDA graphs; --enforce-eager to compare) generates --steps tokens for each batch of 8-token prompts under
vLLM's torch profiler. The GPU kernels of the trace are summed by category (kernel-name patterns below) and
divided by the steps (the one short prefill is included); the wall time per step is measured around generate.
Writes DIR/profile-decode.json and prints a table. On a CPU there are no GPU kernels: only wall times.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.model_maker import preset_model

VARIANTS = ("dense", "samoyeds")

CATEGORIES = (  # first match wins; vLLM's dense MoE runs its SiLU-and-mul (act_and_mul) as a separate kernel
    ("moe", re.compile(r"samoyeds|moe|topk|expert|act_and_mul", re.I)),
    ("attention", re.compile(r"flash|attn|attention|reshape_and_cache|rotary|rope", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|matmul", re.I)),
)
TOP_KERNELS = 15  # the slowest kernels of a trace are kept by name, to check the categories


def category(kernel: str) -> str:
    return next((name for name, pattern in CATEGORIES if pattern.search(kernel)), "other")


def kernel_times(trace_dir: Path) -> dict[str, float]:
    """µs of GPU time per kernel name over every torch-profiler trace in `trace_dir`."""
    totals: dict[str, float] = defaultdict(float)
    for path in sorted(trace_dir.glob("*.json*")):
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
            events = json.load(f).get("traceEvents", [])
        for event in events:
            if event.get("cat") == "kernel":
                totals[event.get("name", "")] += float(event.get("dur", 0))
    return dict(totals)


def by_category(times: dict[str, float]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for name, us in times.items():
        totals[category(name)] += us
    return dict(totals)


def profile_variant(model: Path, batch: int, steps: int, out: Path, engine_args: dict) -> dict:
    """One engine (run in its own process): `steps` tokens for `batch` sequences, profiled after a warm-up."""
    from vllm import LLM, SamplingParams

    trace_dir = out / f"trace-{model.name}-b{batch}"
    llm = LLM(
        str(model),
        load_format="dummy",
        max_num_seqs=batch,
        **engine_args,
        profiler_config={
            "profiler": "torch",
            "torch_profiler_dir": str(trace_dir.resolve()),
            "torch_profiler_with_stack": False,
        },
    )
    prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 10 for j in range(8)]} for i in range(batch)]
    params = SamplingParams(max_tokens=steps, ignore_eos=True, temperature=0.0)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    llm.start_profile()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    llm.stop_profile()
    times = kernel_times(trace_dir)
    top = sorted(times.items(), key=lambda item: -item[1])[:TOP_KERNELS]
    return {
        batch: {
            "wall_ms_per_step": 1e3 * wall / steps,
            "kernel_ms_per_step": {k: v / 1e3 / steps for k, v in sorted(by_category(times).items())},
            "top_kernels_us_per_step": [
                {"name": name[:160], "category": category(name), "us": us / steps} for name, us in top
            ],
        }
    }


def table(results: dict) -> str:
    names = [name for name, _ in CATEGORIES] + ["other"]
    lines = [
        f"{'variant':>9} {'batch':>5} {'wall ms':>8} "
        + " ".join(f"{n:>10}" for n in names)
        + f" {'kernels':>8}  (ms per decode step)"
    ]
    for variant, per_batch in results.items():
        for batch, r in per_batch.items():
            k = r["kernel_ms_per_step"]
            lines.append(
                f"{variant:>9} {batch:>5} {r['wall_ms_per_step']:>8.2f} "
                + " ".join(f"{k.get(n, 0.0):>10.2f}" for n in names)
                + f" {sum(k.values()):>8.2f}"
            )
    if not any(r["kernel_ms_per_step"] for per_batch in results.values() for r in per_batch.values()):
        lines.append("no GPU kernels in the traces (a CPU run?): wall times only")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--pattern", default="samoyeds", choices=["2:4", "samoyeds"])
    parser.add_argument("--batch", default="1,16", help="concurrent sequences, comma-separated")
    parser.add_argument("--steps", type=int, default=64, help="tokens generated per sequence")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine_args = {"max_model_len": args.max_model_len, "enforce_eager": args.enforce_eager}
    if args.worker:  # one engine: print its result as JSON on the last line
        result = profile_variant(Path(args.worker[0]), int(args.worker[1]), args.steps, out, engine_args)
        print(json.dumps(result))
        sys.stdout.flush()
        os._exit(0)  # vLLM's engine processes can keep the interpreter alive
    pattern = Pattern.parse(args.pattern)
    results: dict = {}
    for variant in args.variants.split(","):
        model = preset_model(args.preset, out / "models" / variant, pattern if variant == "samoyeds" else None)
        results[variant] = {}
        for batch in map(int, args.batch.split(",")):
            command = [
                sys.executable,
                __file__,
                "--worker",
                str(model),
                str(batch),
                "--out",
                str(out),
                "--steps",
                str(args.steps),
                "--max-model-len",
                str(args.max_model_len),
                *(["--enforce-eager"] if args.enforce_eager else []),
            ]
            log = out / f"profile-{variant}-b{batch}.log"
            with open(log, "w") as f:
                done = subprocess.run(command, stdout=subprocess.PIPE, stderr=f, text=True)
            if done.returncode != 0:
                sys.exit(f"{variant} batch {batch} failed (exit {done.returncode}); see {log}")
            results[variant].update(json.loads(done.stdout.strip().splitlines()[-1]))
    record = {
        "preset": args.preset,
        "pattern": str(pattern),
        "steps": args.steps,
        "enforce_eager": args.enforce_eager,
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    (out / "profile-decode.json").write_text(json.dumps(record, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
