"""Merges `bench e2e` runs of one machine into one folder, each point from exactly one run, for `samoyeds-vllm bench
e2e --report --out FOLDER` to compare. A results folder's merge.py names the run of each point and calls
merge_runs; the rows keep the name of their run ("run").
"""

from __future__ import annotations

import json
from pathlib import Path

#: variant: [(run folder, mix "INxOUT", batch sizes or None for all)]
OfflineSources = dict[str, list[tuple[str, str, set[int] | None]]]


def merge_runs(here: Path, offline: OfflineSources, serving: dict[str, str] | None = None) -> None:
    """here/merged/variant-NAME.json for each variant of `offline`: its offline points from the runs named there, and
    its served levels, memory and server flags from the run `serving` names for it, if any. Refuses runs of other
    settings, a point taken from two runs, and a point whose counted run compiled a kernel."""
    merged = here / "merged"
    merged.mkdir(exist_ok=True)
    for variant, sources in offline.items():
        result: dict = {}
        for run, mix, batches in sources:
            saved = _load(here, run, variant)
            if not result:
                result = {k: v for k, v in saved.items() if k not in ("throughput", "offline_engines")}
                result["throughput"], result["offline_engines"] = [], {}
            assert saved["settings"] == result["settings"], f"{run}: {variant} measured with other settings"
            result["throughput"] += [
                {**row, "run": run}
                for row in saved["throughput"]
                if f"{row['input_len']}x{row['output_len']}" == mix
                and (batches is None or row["batch_size"] in batches)
            ]
            # a mix's points from two runs: engines of the same flags and KV cache, the first run's record kept
            engine = result["offline_engines"].setdefault(mix, saved["offline_engines"][mix])
            assert engine["kv_cache_tokens"] == saved["offline_engines"][mix]["kv_cache_tokens"], f"{run}: {mix}"
        if run := (serving or {}).get(variant):
            saved = _load(here, run, variant)
            assert saved["settings"] == result["settings"], f"{run}: {variant} served with other settings"
            levels = [{**level, "run": run} for level in saved["serving"]["levels"]]
            result["serving"] = {**saved["serving"], "levels": levels}
            result["memory"], result["server_args"] = saved["memory"], saved["server_args"]
        points = [(r["input_len"], r["output_len"], r["batch_size"]) for r in result["throughput"]]
        assert len(points) == len(set(points)), f"{variant}: a point taken from two runs"
        assert all(r["jit_free"] for r in result["throughput"]), f"{variant}: a point that compiled"
        result["throughput"].sort(key=lambda row: (row["input_len"], row["output_len"], row["batch_size"]))
        (merged / f"variant-{variant}.json").write_text(json.dumps(result, indent=2) + "\n")


def _load(here: Path, run: str, variant: str) -> dict:
    return json.loads((here / run / f"variant-{variant}.json").read_text())
