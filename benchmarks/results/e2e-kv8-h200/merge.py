"""Builds merged/ from this folder's two runs (one host of two H200s, 2026-11-28, FP8 KV cache on both sides), then
`samoyeds-vllm bench e2e --report --out merged` writes the comparison. Each variant's points come from its one run.
"""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for merge_e2e
from merge_e2e import merge_runs  # noqa: E402

MIXES = ("1024x256", "4096x64")
OFFLINE = {  # variant: [(run folder, mix, batch sizes or None for all)]
    "dense-fp8": [("kv8d8", mix, None) for mix in MIXES],
    "samoyeds-fp8": [("kv8s", mix, None) for mix in MIXES],
}


if __name__ == "__main__":
    merge_runs(HERE, OFFLINE)
