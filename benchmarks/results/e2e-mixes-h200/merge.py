"""Builds merged/ from this folder's runs (one host of two H200s, 2026-11-28), then `samoyeds-vllm bench e2e
--report --out merged` writes the comparison. Dense FP8 at 128:128 was not run here (the report refuses to mix
devices): docs/benchmarks.md sets it beside these from ../e2e-qwen3-fp8-h200/offline-2026-11-27/.

Each timed point comes from exactly one run, named in its row's "run". Samoyeds FP8 1024:256 at 64 / 256 / 1024
sequences comes from mixes2/, not mixes/: mixes/' engine shared the host with mixes1/'s dense FP8 engine, whose
DeepGEMM compiles (nvcc on the shared CPUs, into the shared JIT cache) the harness counted against the samoyeds
engine (13 and 10 "compiles" at 256 / 1024, none in its own log; all three timed runs of each counted some) and
which slowed it (256: 13.29 s against 10.02 s in mixes2/, which ran beside a dense bf16 engine, no DeepGEMM).

Dense FP8 1024:256 at 256 / 1024 sequences was run again later with no other engine on the host during its timed
batches (mixes4/: 5,076 / 6,205 tok/s); the higher numbers of mixes1/ (5,404 / 6,504, beside the samoyeds engine)
stay the peer's here, the harder ones to beat. Dense bf16 4096:64 comes from mixes5/ (later the same day).
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = {  # variant: [(run folder, mix, batch sizes or None for all)]
    "dense": [("quick1", "128x128", None), ("mixes3", "1024x256", None), ("mixes5", "4096x64", None)],
    "dense-fp8": [("mixes1", "1024x256", None), ("mixes1b", "4096x64", None)],
    "samoyeds-fp8": [
        ("quick0", "128x128", None),
        ("mixes", "1024x256", {1, 16}),
        ("mixes2", "1024x256", None),
        ("mixes", "4096x64", None),
    ],
}


def main() -> None:
    merged = HERE / "merged"
    merged.mkdir(exist_ok=True)
    for variant, sources in SOURCES.items():
        result: dict = {}
        for run, mix, batches in sources:
            saved = json.loads((HERE / run / f"variant-{variant}.json").read_text())
            if not result:
                result = {k: v for k, v in saved.items() if k not in ("throughput", "offline_engines")}
                result["throughput"], result["offline_engines"] = [], {}
            assert saved["settings"] == result["settings"], f"{run}: {variant} measured with other settings"
            rows = [
                {**row, "run": run}
                for row in saved["throughput"]
                if f"{row['input_len']}x{row['output_len']}" == mix
                and (batches is None or row["batch_size"] in batches)
            ]
            result["throughput"] += rows
            # a mix's points from two runs: engines of the same flags and KV cache, the first run's record kept
            engine = result["offline_engines"].setdefault(mix, saved["offline_engines"][mix])
            assert engine["kv_cache_tokens"] == saved["offline_engines"][mix]["kv_cache_tokens"], f"{run}: {mix}"
        points = [(r["input_len"], r["output_len"], r["batch_size"]) for r in result["throughput"]]
        assert len(points) == len(set(points)), f"{variant}: a point taken from two runs"
        result["throughput"].sort(key=lambda row: (row["input_len"], row["output_len"], row["batch_size"]))
        (merged / f"variant-{variant}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
