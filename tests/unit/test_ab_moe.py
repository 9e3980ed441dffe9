"""benchmarks/ab_moe.py: the trees alternate round by round, each bench runs outside the checkout with its tree first
on PYTHONPATH, and the summary compares the best of each tree's rounds (bench moe itself replaced by a fake)."""

import argparse
import importlib.util
import json
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "ab_moe.py"
spec = importlib.util.spec_from_file_location("ab_moe", SCRIPT)
ab_moe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_moe)


def bench_json(shape: str, us: dict[int, float], err: float) -> dict:
    rows = [{"tokens": t, "paths": [{"name": "ours-bf16", "us": v, "rel_err_own": err}]} for t, v in us.items()]
    return {"shape": shape, "rows": rows}


def test_summary_compares_the_best_rounds_and_shows_the_errors():
    results = {
        "before": [bench_json("qwen3", {1: 18.0}, 3e-3), bench_json("qwen3", {1: 17.5}, 3e-3)],
        "after": [bench_json("qwen3", {1: 15.2}, 3e-3), bench_json("qwen3", {1: 15.0}, 3e-3)],
    }
    header, line = ab_moe.summarize(results, ["before", "after"]).splitlines()
    assert "before | after" in header
    assert line == "qwen3 ours-bf16 1: 18.0 17.5 | 15.2 15.0 | 1.167 | 3.000e-03 3.000e-03"


def test_arguments_are_checked(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=PATH"):
        ab_moe.parse_tree("/tmp/old")
    with pytest.raises(argparse.ArgumentTypeError, match="holds no samoyeds_vllm package"):
        ab_moe.parse_tree(f"old={tmp_path}")
    assert ab_moe.parse_tree("new=") == ("new", "")
    with pytest.raises(argparse.ArgumentTypeError, match="SHAPE:TOKENS"):
        ab_moe.parse_run("qwen3-30b-a3b")
    assert ab_moe.parse_env("new:SAMOYEDS_DEPENDENT_LAUNCH=0") == ("new", "SAMOYEDS_DEPENDENT_LAUNCH", "0")


def test_trees_alternate_outside_the_checkout(tmp_path, monkeypatch):
    old = tmp_path / "old"
    (old / "samoyeds_vllm").mkdir(parents=True)
    calls = []

    scratch = set()

    def fake_run(command, env, cwd, capture_output, text, check=False):
        assert Path(cwd) != Path.cwd() and not (Path(cwd) / "samoyeds_vllm").exists()
        scratch.add(Path(cwd))
        tree = "old" if env.get("PYTHONPATH", "").startswith(str(old)) else "new"
        if "-c" in command:  # which package the tree imports
            return _Done(f"{tree}/samoyeds_vllm/__init__.py\n")
        calls.append((tree, env.get("SAMOYEDS_X")))
        out = Path(command[command.index("--json") + 1])
        out.write_text(json.dumps(bench_json("qwen3-30b-a3b", {1: 20.0 if tree == "old" else 16.0}, 3e-3)))
        return _Done("table\n")

    monkeypatch.setattr(ab_moe.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    ab_moe.main(
        ["--tree", f"old={old}", "--tree", "new=", "--run", "qwen3-30b-a3b:1", "--env", "new:SAMOYEDS_X=0",
         "--rounds", "2", "--out", str(tmp_path / "ab")]
    )  # fmt: skip
    assert calls == [("old", None), ("new", "0"), ("old", None), ("new", "0")]
    summary = (tmp_path / "ab" / "summary.txt").read_text()
    assert "qwen3-30b-a3b ours-bf16 1: 20.0 20.0 | 16.0 16.0 | 1.250" in summary
    log = (tmp_path / "ab" / "log.txt").read_text()
    assert "tree old: old/samoyeds_vllm/__init__.py" in log and "--- new qwen3-30b-a3b round 2" in log
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    assert len(scratch) == 1 and not scratch.pop().exists()  # the benches' temporary folder is gone


class _Done:
    def __init__(self, stdout: str):
        self.stdout, self.stderr, self.returncode = stdout, "", 0


def _section(path: str, old: str, new: str) -> str:
    return f"diff --git a/{path} b/{path}\nindex 1..2 100644\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n"


def test_a_diff_tree_is_the_checkout_with_the_branchs_package_changes(tmp_path):
    """A branch's diff (`git diff main...BRANCH`) also changes tests and results: only samoyeds_vllm/, csrc/ and
    configs/ are applied, on a copy of the checkout, with csrc/ and configs/ moved into the package."""
    root = tmp_path / "checkout"
    for name, text in {"samoyeds_vllm/__init__.py": "x = 1", "csrc/gemm.cuh": "old", "configs/t.json": "{}"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    diff = tmp_path / "branch.diff"
    diff.write_text(_section("csrc/gemm.cuh", "old", "new") + _section("tests/test_gemm.py", "a", "b"))
    assert ab_moe.parse_tree(f"branch={diff}") == ("branch", str(diff))
    tree = ab_moe.diff_tree(diff, tmp_path / "tree", root)
    assert (tree / "samoyeds_vllm" / "csrc" / "gemm.cuh").read_text() == "new\n"
    assert (tree / "samoyeds_vllm" / "configs" / "t.json").exists() and not (tree / "tests").exists()
    assert (root / "csrc" / "gemm.cuh").read_text() == "old\n"  # the checkout itself untouched

    stale = tmp_path / "stale.diff"
    stale.write_text(_section("csrc/gemm.cuh", "older", "new"))
    with pytest.raises(SystemExit, match="stale.diff does not apply"):
        ab_moe.diff_tree(stale, tmp_path / "tree2", root)
    tests_only = tmp_path / "tests.diff"
    tests_only.write_text(_section("tests/test_gemm.py", "a", "b"))
    with pytest.raises(SystemExit, match="changes nothing under samoyeds_vllm, csrc, configs"):
        ab_moe.diff_tree(tests_only, tmp_path / "tree3", root)
    with pytest.raises(argparse.ArgumentTypeError, match="no diff at"):
        ab_moe.parse_tree(f"gone={tmp_path / 'gone.diff'}")
