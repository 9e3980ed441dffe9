"""Perplexity against GPU minutes of `samoyeds-vllm recover`, from the recover_log.json files it writes.

    python benchmarks/quality/plot_recovery.py OUT.png LABEL=LOG.json [LABEL=LOG.json ...] [--dense PPL]

Plots each run's validation perplexity (transformers, measured during recovery) against its training time, with
the dense model's as a reference line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="+", help="LABEL=recover_log.json")
    parser.add_argument("--dense", type=float, help="the dense model's validation perplexity (a reference line)")
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for run in args.runs:
        label, _, path = run.rpartition("=")
        log = json.loads(Path(path).read_text())
        minutes = [e["seconds"] / 60 for e in log["eval"]]
        ax.plot(minutes, [e["perplexity"] for e in log["eval"]], marker="o", label=label)
    if args.dense:
        ax.axhline(args.dense, color="black", linestyle="--", label=f"dense {args.dense:.2f} (whole split)")
    ax.set_yscale("log")
    ax.set_xlabel("GPU minutes of recovery")
    ax.set_ylabel("validation perplexity")
    ax.set_title("Recovery by distillation from the dense model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
