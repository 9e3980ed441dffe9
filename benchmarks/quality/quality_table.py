"""What pruning costs in quality: every pattern x method, converted and scored by vLLM on held-out text.

    python benchmarks/quality/quality_table.py MODEL --calib-data CALIB --test-data TEST --out OUT \
        [--patterns 2:4,samoyeds] [--methods magnitude,wanda,sparsegpt] [--engine-args "..."]

For each pattern and method: `samoyeds-vllm convert` (timed; its report gives peak host and GPU memory), then
`samoyeds-vllm eval` of the dense model and every sparse one on TEST, each engine in its own process (waiting
for the GPU's memory to be free between them). Results accumulate in OUT/results.json, so a run cut short resumes
where it stopped; OUT/results.md holds the table and OUT/perplexity.png the plot. Converted models are written
under OUT/models/ (delete them after).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "samoyeds_vllm.cli"]


def _wait_for_free_gpu(timeout: float = 120.0) -> None:
    """vLLM's engine process can outlive the command that started it: wait until the GPU holds no memory."""
    try:
        import torch

        if not torch.cuda.is_available():
            return
    except ImportError:
        return
    deadline = time.time() + timeout
    while time.time() < deadline:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        used = subprocess.run(query, capture_output=True, text=True).stdout.split()
        if used and max(int(u) for u in used) < 1024:
            return
        time.sleep(2)


def _run(cmd: list[str], log: Path) -> float:
    start = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(f"failed ({code}): {shlex.join(cmd)}\n{log.read_text()[-3000:]}")
    return time.perf_counter() - start


def _file_name(name: str) -> str:
    return name.replace(":", "of").replace("(V=", "-v").replace(")", "")


def _table(results: dict) -> str:
    dense = results["dense"]["eval"]["perplexity"]
    lines = [
        "| model | perplexity | increase over dense | bits/byte | convert s | peak host GiB | peak GPU GiB |",
        "|---|---|---|---|---|---|---|",
        f"| dense | {dense:.3f} | | {results['dense']['eval']['bits_per_byte']:.4f} | | | |",
    ]
    for name, r in results.items():
        if name == "dense" or "eval" not in r:
            continue
        ppl, rep = r["eval"]["perplexity"], r["report"]
        lines.append(
            f"| {name} | {ppl:.3f} | {ppl / dense - 1:+.1%} | {r['eval']['bits_per_byte']:.4f} | "
            f"{r['convert_seconds']:.1f} | {rep['peak_host_bytes'] / 2**30:.2f} | {rep['peak_gpu_bytes'] / 2**30:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = results["dense"]["eval"]["perplexity"]
    patterns = sorted({r["pattern"] for r in results.values() if "pattern" in r})
    methods = [m for m in ("magnitude", "wanda", "sparsegpt") if any(r.get("method") == m for r in results.values())]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = [results.get(f"{p}-{method}", {}).get("eval", {}).get("perplexity", 0) for p in patterns]
        bars = ax.bar([x + i * width for x in range(len(patterns))], values, width, label=method)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.axhline(dense, color="black", linestyle="--", label=f"dense {dense:.2f}")
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(patterns))], patterns)
    ax.set_ylabel("test perplexity (vLLM)")
    ax.set_title("Perplexity after one-shot pruning of the experts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--calib-data", required=True)
    parser.add_argument("--test-data", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--patterns", default="2:4,samoyeds")
    parser.add_argument("--methods", default="magnitude,wanda,sparsegpt")
    parser.add_argument("--segment", type=int, help="samoyeds segment V (default 128)")
    parser.add_argument("--convert-args", default="", help="extra convert flags, quoted (e.g. calibration size)")
    parser.add_argument("--engine-args", default="", help="vLLM engine flags for every eval, quoted")
    parser.add_argument("--eval-args", default="", help="extra eval flags, quoted (e.g. --window)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "models").mkdir(exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}

    def save() -> None:
        path.write_text(json.dumps(results, indent=2) + "\n")

    def evaluate(name: str, model: Path) -> None:
        out = args.out / "logs" / f"eval-{_file_name(name)}.json"
        _wait_for_free_gpu()
        cmd = [*CLI, "eval", str(model), "--data", args.test_data, "--json", str(out)]
        cmd += shlex.split(args.eval_args) + ([f"--engine-args={args.engine_args}"] if args.engine_args else [])
        _run(cmd, args.out / "logs" / f"eval-{_file_name(name)}.log")
        results[name]["eval"] = json.loads(out.read_text())
        save()

    if "eval" not in results.get("dense", {}):
        results["dense"] = {}
        evaluate("dense", args.model)
    for pattern in args.patterns.split(","):
        segment = ["--segment", str(args.segment)] if args.segment and pattern == "samoyeds" else []
        label = f"samoyeds(V={args.segment})" if segment else pattern
        for method in args.methods.split(","):
            name = f"{label}-{method}"
            if "eval" in results.get(name, {}):
                continue
            target = args.out / "models" / _file_name(name)
            cmd = [*CLI, "convert", str(args.model), str(target), "--pattern", pattern, *segment]
            cmd += ["--method", method, "--force"]
            if method != "magnitude":
                cmd += ["--calib-data", args.calib_data, *shlex.split(args.convert_args)]
            seconds = _run(cmd, args.out / "logs" / f"convert-{_file_name(name)}.log")
            report = json.loads((target / "samoyeds_report.json").read_text())
            results[name] = {"pattern": label, "method": method, "convert_seconds": seconds, "report": report}
            save()
            evaluate(name, target)
            print(f"{name}: perplexity {results[name]['eval']['perplexity']:.3f}", flush=True)
    (args.out / "results.md").write_text(_table(results))
    _plot(results, args.out / "perplexity.png")
    print(_table(results))


if __name__ == "__main__":
    main()
