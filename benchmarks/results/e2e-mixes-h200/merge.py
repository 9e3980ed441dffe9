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

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for merge_e2e
from merge_e2e import merge_runs  # noqa: E402

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


if __name__ == "__main__":
    merge_runs(HERE, SOURCES)
