#!/usr/bin/env bash
# The main job end to end on a CPU, on a model that has learnt a little English: make a tiny Qwen3-MoE, train it
# for a minute on the standard library's docstrings, convert it to the 75%-sparse samoyeds format with SparseGPT
# (calibrated on the same text), serve the dense and the sparse model with `vllm serve` and print their perplexity
# on other modules' docstrings (held out from training) and their answers side by side. Output goes to
# ${1:-./demo-out}.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/env.sh" | tail -n 1)"
OUT="$(mkdir -p "${1:-demo-out}" && cd "${1:-demo-out}" && pwd)"
CLI="$VENV/bin/samoyeds-vllm"
PY="$VENV/bin/python"
"$PY" "$ROOT/examples/train_tiny_moe.py" write-text "$OUT/text"
"$CLI" make-model --arch qwen3_moe --preset tiny --out "$OUT/random" --force
"$PY" "$ROOT/examples/train_tiny_moe.py" train "$OUT/random" "$OUT/dense" --data "$OUT/text/train" --seconds 60 --force
"$CLI" convert "$OUT/dense" "$OUT/sparse" --pattern samoyeds --method sparsegpt --calib-data "$OUT/text/train" \
  --calib-samples 64 --calib-seq-len 256 --force
cd "$OUT"
# Perplexity in windows of the 128 tokens the model trained on: it never saw a position beyond.
"$PY" "$ROOT/examples/serve_and_query.py" "$OUT/dense" "$OUT/sparse" --eval-data "$OUT/text/heldout" --eval-window 128
