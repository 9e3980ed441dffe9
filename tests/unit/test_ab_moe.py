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

    def fake_run(command, env, cwd, capture_output, text, check=False):
        assert Path(cwd) != Path.cwd() and not (Path(cwd) / "samoyeds_vllm").exists()
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


class _Done:
    def __init__(self, stdout: str):
        self.stdout, self.stderr, self.returncode = stdout, "", 0
