"""Builds merged/ from this folder's runs (one host of two H200s, 2026-11-28, harness 4), then `samoyeds-vllm bench
e2e --report --out merged` writes the comparison.

Each timed point comes from exactly one run, named in its row's "run" (offline) or level's "run" (serving). Dense FP8
128:128 at 16 sequences comes from h4d8b/: in h4d8/ all three timed runs of that point counted DeepGEMM compiles
(`jit_free` false, 284 tok/s), h4d8b/ ran it again on the same engine flags (1,738). At 64 sequences both runs were
free of compiles; h4d8/'s 5,348 (h4d8b/: 4,972) stays the peer's, the harder number to beat. Dense bf16 ran no
128:128 and no serving here.
"""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for merge_e2e
from merge_e2e import merge_runs  # noqa: E402

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


if __name__ == "__main__":
    merge_runs(HERE, OFFLINE, SERVING)
