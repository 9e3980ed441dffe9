"""benchmarks/merge_tables.py: which config a token count takes from tune_kernels.py runs, and what is written."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "merge_tables.py"
MIXTRAL = "E=8,H=4096,I=14336,top_k=2,pattern=samoyeds128-fp8,dtype=bfloat16,device_name=NVIDIA_H200.json"


def row(tokens: int, us: dict, configs: dict) -> dict:
    return {"shape": "mixtral-8x7b", "pattern": "samoyeds(V=128)", "values": "fp8", "tokens": tokens, "us": us,
            "best": min(us, key=lambda k: min(us[k])), "configs": configs}  # fmt: skip


def merge(tmp_path: Path, *runs: list[dict], margin: str = "0.03") -> tuple[dict, str]:
    paths = []
    for i, rows in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps({"device": "NVIDIA H200", "rows": rows}))
    tables = tmp_path / "tables"
    tables.mkdir(exist_ok=True)
    (tables / MIXTRAL).write_text(json.dumps({"1": {}, "8": {"down": {"splits": 3}}, "16": {}}))
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), *map(str, paths), "--out", str(out), "--tables", str(tables)]
    done = subprocess.run([*cmd, "--margin", margin], capture_output=True, text=True, check=True)
    return json.loads((out / MIXTRAL).read_text()), done.stdout


TILE16 = {"token_tile": 16}
TABLE8 = {"down": {"splits": 3}}


def test_a_config_must_beat_the_current_entry_in_both_rounds_by_the_margin(tmp_path):
    activations = [
        row(8, {"default": [100, 101], "tuned table": [90, 91]}, {"default": {}, "tuned table": TABLE8}),
        row(16, {"default": [100, 100], "tuned table": [100, 100]}, {"default": {}, "tuned table": {}}),
    ]
    tiles = [  # another run, slower overall: taken relative to its own default
        row(8, {"default": [200, 200], "token tile 16": [178, 182]}, {"default": {}, "token tile 16": TILE16}),
        row(16, {"default": [200, 200], "token tile 16": [180, 196]}, {"default": {}, "token tile 16": TILE16}),
        row(24, {"default": [200, 200], "token tile 16": [190, 192]}, {"default": {}, "token tile 16": TILE16}),
    ]
    table, log = merge(tmp_path, activations, tiles)
    # T = 8: 0.91 of default against the table's 0.90, kept; T = 16: 0.98 in its slower round, under 3%, kept;
    # T = 24 (past the table, the heuristics): 0.96, taken
    assert table == {"1": {}, "8": TABLE8, "16": {}, "24": TILE16}
    assert "T=24: None -> {'token_tile': 16}" in log
    table, _ = merge(tmp_path, activations, tiles, margin="0.01")
    assert table["16"] == TILE16 and table["8"] == TABLE8


def test_an_entry_no_run_timed_is_kept_and_the_default_can_replace_an_entry(tmp_path):
    splits = [row(8, {"default": [100, 100], "splits 1,1": [99, 99]}, {"default": {}, "splits 1,1": {}})]
    table, log = merge(tmp_path, splits)
    assert table["8"] == TABLE8 and "was not timed, kept" in log
    activations = [row(8, {"default": [90, 90], "tuned table": [100, 100]}, {"default": {}, "tuned table": TABLE8})]
    table, _ = merge(tmp_path, activations)
    assert table["8"] == {}


def test_by_default_it_starts_from_the_shipped_tables():
    spec = importlib.util.spec_from_file_location("merge_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (module.SHIPPED / MIXTRAL).is_file()
