#!/usr/bin/env bash
# On a GPU machine (the project's device runs): install the project without dependencies, run the GPU tests and
# the MoE benchmark. Results go to ${OUT:-gpu-out}. Pass pytest -k expressions or benchmark shapes via env:
#   GPU_TESTS="-k 'qwen3'"  BENCH_SHAPES="qwen3-30b-a3b mixtral-8x7b"  BENCH_PATTERNS="samoyeds 2:4"
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
cd "$ROOT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
if [[ "${GPU_TESTS-}" != "skip" ]]; then
  eval python3 -m pytest -q -x tests/test_kernels.py ${GPU_TESTS-} -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
fi
for shape in ${BENCH_SHAPES-qwen3-30b-a3b mixtral-8x7b}; do
  for pattern in ${BENCH_PATTERNS-samoyeds}; do
    python3 -m samoyeds_vllm.cli bench moe --shape "$shape" --pattern "$pattern" ${BENCH_ARGS-} \
      --json "$OUT/bench-$shape-${pattern/:/of}.json" 2>&1 | grep -v "it/s\]" | tee -a "$OUT/bench.log"
  done
done
