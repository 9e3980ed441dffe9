"""Builds merged/ from this folder's runs (one host of two H200s, 2026-11-28, harness 4), then `samoyeds-vllm bench
e2e --report --out merged` writes the comparison.

Each timed point comes from exactly one run, named in its row's "run" (offline) or level's "run" (serving). Dense FP8
128:128 at 16 sequences comes from h4d8b/: in h4d8/ all three timed runs of that point counted DeepGEMM compiles
(`jit_free` false, 284 tok/s), h4d8b/ ran it again on the same engine flags (1,738). At 64 sequences both runs were
free of compiles; h4d8/'s 5,348 (h4d8b/: 4,972) stays the peer's, the harder number to beat. Dense bf16 ran no
128:128 and no serving here.
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
OFFLINE = {  # variant: [(run folder, mix, batch sizes or None for all)]
    "dense": [("h4d", "1024x256", None), ("h4d", "4096x64", None)],
    "dense-fp8": [
        ("h4d8", "128x128", {64, 256, 1024}),
        ("h4d8b", "128x128", {16}),
        ("h4d8", "1024x256", None),
        ("h4d8", "4096x64", None),
    ],
    "samoyeds-fp8": [("h4s", "128x128", None), ("h4s", "1024x256", None), ("h4s", "4096x64", None)],
}
SERVING = {"dense-fp8": "h4vd8", "samoyeds-fp8": "h4vs"}  # variant: run folder


def load(run: str, variant: str) -> dict:
    return json.loads((HERE / run / f"variant-{variant}.json").read_text())


def main() -> None:
    merged = HERE / "merged"
    merged.mkdir(exist_ok=True)
    for variant, sources in OFFLINE.items():
        result: dict = {}
        for run, mix, batches in sources:
            saved = load(run, variant)
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
        if run := SERVING.get(variant):
            saved = load(run, variant)
            assert saved["settings"] == result["settings"], f"{run}: {variant} served with other settings"
            result["serving"] = {**saved["serving"], "levels": [{**lv, "run": run} for lv in saved["serving"]["levels"]]}
            result["memory"], result["server_args"] = saved["memory"], saved["server_args"]
        points = [(r["input_len"], r["output_len"], r["batch_size"]) for r in result["throughput"]]
        assert len(points) == len(set(points)), f"{variant}: a point taken from two runs"
        assert all(r["jit_free"] for r in result["throughput"]), f"{variant}: a point that compiled"
        result["throughput"].sort(key=lambda row: (row["input_len"], row["output_len"], row["batch_size"]))
        (merged / f"variant-{variant}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
