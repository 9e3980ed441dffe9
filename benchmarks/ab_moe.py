"""A/B of our MoE layer between source trees on one GPU: `samoyeds-vllm bench moe --no-vllm` for each tree in turn,
round after round (so drift in clocks or temperature hits every tree alike), then the best of the rounds per tree.

    python benchmarks/ab_moe.py --tree before=/tmp/before --tree after= --run qwen3-30b-a3b:1,16 \
        --run mixtral-8x7b:1 [--values fp8] [--pattern samoyeds] [--rounds 2] [--env after:SAMOYEDS_X=0] --out DIR

A tree is NAME=PATH: PATH goes first on PYTHONPATH (a directory holding a `samoyeds_vllm` package with its csrc/ and
configs/ inside: `git archive REV samoyeds_vllm csrc configs | tar -x -C PATH && mv PATH/csrc PATH/configs
PATH/samoyeds_vllm/`); an empty PATH is the installed project; a PATH ending in .diff or .patch is this checkout
with that diff applied (`git diff main...BRANCH`: its changes to samoyeds_vllm/, csrc/ and configs/, the rest left
out), made in a temporary folder (no git needed where it runs, only `patch`). The same tree twice under two names
with different `--env` compares settings. Every bench runs from a scratch directory, so a checkout in the current
directory does not shadow PATH, and the run first prints which file each tree imports. DIR gets each bench's JSON,
log.txt and summary.txt: per run, path and token count, each tree's µs in every round, the first tree's best over
each tree's best, and each tree's error against the fp32 reference (equal errors: the trees compute the same).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout a diff tree starts from
TREE_DIRS = ("samoyeds_vllm", "csrc", "configs")  # what a tree holds; csrc/ and configs/ move into the package
DIFF_SUFFIXES = (".diff", ".patch")


def parse_tree(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a tree is NAME=PATH (PATH may be empty), not {text!r}")
    if path.endswith(DIFF_SUFFIXES):
        if not Path(path).is_file():
            raise argparse.ArgumentTypeError(f"no diff at {path}")
    elif path and not (Path(path) / "samoyeds_vllm").is_dir():
        raise argparse.ArgumentTypeError(f"{path} holds no samoyeds_vllm package")
    return name, path


def package_sections(diff: str) -> str:
    """The sections of a git diff that change TREE_DIRS (a branch's diff also holds tests, docs, results)."""
    sections = re.split(r"(?m)^(?=diff --git )", diff)
    keep = [
        section
        for section in sections
        if section.startswith("diff --git a/") and section.split(" ")[2].removeprefix("a/").split("/")[0] in TREE_DIRS
    ]
    return "".join(keep)


def diff_tree(diff: Path, where: Path, root: Path = ROOT) -> Path:
    """`root`'s TREE_DIRS with `diff`'s changes to them applied, as a tree in `where` (csrc/, configs/ inside the
    package). A diff that does not apply is an error naming it; one that changes none of them is refused."""
    patch = package_sections(diff.read_text())
    if not patch:
        sys.exit(f"{diff} changes nothing under {', '.join(TREE_DIRS)}")
    if where.exists():
        shutil.rmtree(where)
    for name in TREE_DIRS:
        shutil.copytree(root / name, where / name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "--silent"], input=patch, cwd=where, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"{diff} does not apply to {root}:\n{done.stdout}{done.stderr}")
    for name in TREE_DIRS[1:]:
        (where / name).rename(where / "samoyeds_vllm" / name)
    return where


def parse_run(text: str) -> tuple[str, str]:
    shape, sep, tokens = text.partition(":")
    if not sep or not shape or not tokens:
        raise argparse.ArgumentTypeError(f"a run is SHAPE:TOKENS (e.g. qwen3-30b-a3b:1,16), not {text!r}")
    return shape, tokens


def parse_env(text: str) -> tuple[str, str, str]:
    tree, sep, assignment = text.partition(":")
    key, eq, value = assignment.partition("=")
    if not sep or not eq or not key:
        raise argparse.ArgumentTypeError(f"an env setting is TREE:KEY=VALUE, not {text!r}")
    return tree, key, value


def tree_environment(path: str, settings: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **settings}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(path).resolve()), env.get("PYTHONPATH")) if p)
    return env


def summarize(results: dict[str, list[dict]], trees: list[str]) -> str:
    """results: tree name -> bench moe JSONs (one per run and round). One line per (shape, path, tokens)."""
    us: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    err: dict[tuple, dict[str, float]] = defaultdict(dict)
    for tree, jsons in results.items():
        for result in jsons:
            for row in result["rows"]:
                for path in row["paths"]:
                    if path.get("status", "ok") != "ok":
                        continue
                    key = (result["shape"], path["name"], row["tokens"])
                    us[key][tree].append(path["us"])
                    err[key].setdefault(tree, path["rel_err_own"])
    head = " | ".join(trees)
    lines = [f"shape path T: µs per round ({head}) | {trees[0]} best / each best | error against fp32 ({head})"]
    for key in sorted(us):
        rounds = us[key]
        if not all(rounds.get(t) for t in trees):
            continue
        cells = " | ".join(" ".join(f"{v:.1f}" for v in rounds[t]) for t in trees)
        ratios = " ".join(f"{min(rounds[trees[0]]) / min(rounds[t]):.3f}" for t in trees[1:])
        errors = " ".join(f"{err[key][t]:.3e}" for t in trees)
        lines.append(f"{key[0]} {key[1]} {key[2]}: {cells} | {ratios} | {errors}")
    return "\n".join(lines)


def run_trees(args: argparse.Namespace, settings: dict[str, dict[str, str]], log) -> dict[str, list[dict]]:
    """Every run of every tree, tree after tree within a round; the bench JSONs by tree."""
    # the benches run from a temporary folder, not the checkout, whose samoyeds_vllm would shadow PYTHONPATH
    with tempfile.TemporaryDirectory(prefix="ab-moe-") as scratch:
        bench = [sys.executable, "-m", "samoyeds_vllm.cli", "bench", "moe", "--no-vllm", "--pattern", args.pattern]
        for name, path in args.tree:
            where = subprocess.run(
                [sys.executable, "-c", "import samoyeds_vllm; print(samoyeds_vllm.__file__)"],
                env=tree_environment(path, settings[name]),
                cwd=scratch,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            print(f"tree {name}: {where} {settings[name] or ''}", file=log, flush=True)
        results: dict[str, list[dict]] = {name: [] for name, _ in args.tree}
        for round_ in range(1, args.rounds + 1):
            for name, path in args.tree:
                for shape, tokens in args.run:
                    out = (args.out / f"{name}-{shape}-r{round_}.json").resolve()
                    command = [*bench, "--shape", shape, "--tokens", tokens, "--json", str(out)]
                    if args.values == "fp8":
                        command += ["--values", "fp8"]
                    done = subprocess.run(
                        command, env=tree_environment(path, settings[name]), cwd=scratch, capture_output=True, text=True
                    )
                    print(
                        f"--- {name} {shape} round {round_}\n{done.stdout}{done.stderr[-2000:]}", file=log, flush=True
                    )
                    if done.returncode != 0:
                        sys.exit(f"bench moe failed for tree {name}, {shape} (log: {args.out / 'log.txt'})")
                    results[name].append(json.loads(out.read_text()))
        return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=parse_tree, action="append", required=True, help="NAME=PATH, in order")
    parser.add_argument("--run", type=parse_run, action="append", required=True, help="SHAPE:TOKENS")
    parser.add_argument("--pattern", default="samoyeds")
    parser.add_argument("--values", choices=["bf16", "fp8"], default="bf16", help="fp8: bf16 and FP8 values")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--env", type=parse_env, action="append", default=[], help="TREE:KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    names = [name for name, _ in args.tree]
    if len(set(names)) != len(names) or len(names) < 2:
        parser.error("name two or more trees, each once")
    settings: dict[str, dict[str, str]] = {name: {} for name in names}
    for tree, key, value in args.env:
        if tree not in settings:
            parser.error(f"--env names tree {tree!r}, not one of {', '.join(names)}")
        settings[tree][key] = value
    args.out.mkdir(parents=True, exist_ok=True)
    # diff trees in a temporary folder, not in DIR, which keeps the results; removed at the end
    with tempfile.TemporaryDirectory(prefix="ab-trees-") as trees, open(args.out / "log.txt", "a") as log:
        args.tree = [
            (name, str(diff_tree(Path(path), Path(trees) / name)) if path.endswith(DIFF_SUFFIXES) else path)
            for name, path in args.tree
        ]
        results = run_trees(args, settings, log)
    summary = summarize(results, names)
    (args.out / "summary.txt").write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
