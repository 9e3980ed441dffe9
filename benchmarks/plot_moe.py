"""The layer against its peers as a picture, from the JSON files `samoyeds-vllm bench moe --peers` writes.

    python benchmarks/plot_moe.py OUT.png RESULT.json [RESULT.json ...]

One column per file (its shape and pattern): on top the µs of every path that ran against the token count (log-log;
ours solid, the peers dashed), below each of our variants' speed-up over the best peer at that token count (the
peer's µs over ours; above 1 ours is faster), with the peer that was best named at the foot of each token count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)


def timings(result: dict) -> dict[str, list[tuple[int, float]]]:
    """(tokens, µs) of each path, in the file's path order, for the token counts where it ran."""
    series = {name: [] for name in result["paths"]}
    for row in result["rows"]:
        for path in row["paths"]:
            if path.get("status", "ok") == "ok" and path.get("us"):
                series[path["name"]].append((row["tokens"], path["us"]))
    return {name: points for name, points in series.items() if points}


def speedups_over_best(result: dict) -> dict[str, list[tuple[int, float, str]]]:
    """(tokens, the best peer's µs over ours, that peer's name) of each of our variants, where a peer ran."""
    series: dict[str, list[tuple[int, float, str]]] = {}
    for row in result["rows"]:
        for ours, against in row.get("speedups", {}).items():
            if "best" in against:
                series.setdefault(ours, []).append((row["tokens"], against["best"], row["best_peer"]))
    return series


def plot(results: list[dict], out: Path) -> None:
    fig, axes = plt.subplots(2, len(results), figsize=(5.5 * len(results), 8), squeeze=False)
    for column, result in enumerate(results):
        labels = {name: path["label"] for name, path in result["paths"].items()}
        kinds = {name: path["kind"] for name, path in result["paths"].items()}
        top, bottom = axes[0][column], axes[1][column]
        for name, points in timings(result).items():
            tokens, us = zip(*points, strict=True)
            ours = kinds[name] == "ours"
            top.plot(tokens, us, marker="o", linestyle="-" if ours else "--", linewidth=2.2 if ours else 1.2,
                     label=labels[name])  # fmt: skip
        top.set_yscale("log")
        top.set_ylabel("µs per layer (CUDA graphs)")
        top.set_title(f"{result['shape']}, {result['pattern']}\n{result['device']}, {result['date']}", fontsize=10)
        top.legend(fontsize=7)
        best_peer = {}
        for name, points in speedups_over_best(result).items():
            tokens, factor, _ = zip(*points, strict=True)
            bottom.plot(tokens, factor, marker="o", linewidth=2, label=labels[name])
            best_peer.update({t: peer for t, _, peer in points})
        for t, peer in best_peer.items():  # the same peer is best for every variant of ours at a token count
            bottom.text(t, 0.03, labels.get(peer, peer).removeprefix("vLLM "), transform=bottom.get_xaxis_transform(),
                        fontsize=6, rotation=90, ha="center", va="bottom")  # fmt: skip
        bottom.axhline(1.0, color="black", linewidth=0.8)
        bottom.set_ylim(bottom=0)
        tokens = sorted({row["tokens"] for row in result["rows"]})
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(tokens, [str(t) for t in tokens])
            ax.minorticks_off()
        bottom.set_xlabel("tokens")
        bottom.set_ylabel("best peer's µs / ours")
        bottom.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("results", nargs="+", type=Path, help="JSON files of bench moe")
    args = parser.parse_args()
    for path in args.results:
        if not path.is_file():
            parser.error(f"{path}: no such file")
    results = [json.loads(path.read_text()) for path in args.results]
    for path, result in zip(args.results, results, strict=True):
        if not result.get("rows"):
            parser.error(f"{path}: no rows (not a bench moe result, or a run that timed nothing)")
    plot(results, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
