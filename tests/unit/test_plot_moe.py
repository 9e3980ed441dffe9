"""benchmarks/plot_moe.py: what it reads from bench moe's JSON, and the picture it writes."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "plot_moe.py"
spec = importlib.util.spec_from_file_location("plot_moe", SCRIPT)
plot_moe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_moe)


def result() -> dict:
    """Two token counts as bench moe writes them: at 16 the DeepGEMM peer failed."""
    paths = {
        "ours-bf16": {"kind": "ours", "label": "ours samoyeds(V=128) bf16"},
        "ours-fp8": {"kind": "ours", "label": "ours samoyeds(V=128) fp8"},
        "fp8-triton": {"kind": "peer", "label": "vLLM FP8 Triton"},
        "fp8-deepgemm": {"kind": "peer", "label": "vLLM FP8 DeepGEMM"},
    }
    rows = [
        {
            "tokens": 16,
            "paths": [
                {"name": "ours-bf16", "status": "ok", "us": 90.0},
                {"name": "ours-fp8", "status": "ok", "us": 60.0},
                {"name": "fp8-triton", "status": "ok", "us": 150.0},
                {"name": "fp8-deepgemm", "status": "failed", "reason": "RuntimeError: ..."},
            ],
            "best_peer": "fp8-triton",
            "speedups": {"ours-bf16": {"fp8-triton": 150 / 90, "best": 150 / 90}, "ours-fp8": {"best": 2.5}},
        },
        {
            "tokens": 4096,
            "paths": [
                {"name": "ours-bf16", "status": "ok", "us": 500.0},
                {"name": "ours-fp8", "status": "ok", "us": 400.0},
                {"name": "fp8-triton", "status": "ok", "us": 900.0},
                {"name": "fp8-deepgemm", "status": "ok", "us": 700.0},
            ],
            "best_peer": "fp8-deepgemm",
            "speedups": {"ours-bf16": {"best": 1.4}, "ours-fp8": {"best": 1.75}},
        },
    ]
    return {"shape": "qwen3-30b-a3b", "pattern": "samoyeds(V=128)", "device": "H100", "date": "2026-11-25",
            "paths": paths, "rows": rows}  # fmt: skip


def test_timings_keep_the_points_each_path_ran():
    series = plot_moe.timings(result())
    assert series["ours-fp8"] == [(16, 60.0), (4096, 400.0)]
    assert series["fp8-deepgemm"] == [(4096, 700.0)]  # its failed point is left out


def test_speedups_are_the_files_with_the_best_peer_named():
    series = plot_moe.speedups_over_best(result())
    assert series["ours-fp8"] == [(16, 2.5, "fp8-triton"), (4096, 1.75, "fp8-deepgemm")]
    assert [x for _, x, _ in series["ours-bf16"]] == [150 / 90, 1.4]


def test_the_script_writes_a_png_and_refuses_a_missing_file(tmp_path):
    data = tmp_path / "moe.json"
    data.write_text(json.dumps(result()))
    out = tmp_path / "plots" / "moe.png"
    subprocess.run([sys.executable, str(SCRIPT), str(out), str(data), str(data)], check=True, capture_output=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = subprocess.run([sys.executable, str(SCRIPT), str(out), str(tmp_path / "none.json")],
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 2 and "none.json: no such file" in missing.stderr
