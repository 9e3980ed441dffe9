#!/usr/bin/env bash
# The main job on a built-in tiny model, end to end on a CPU: make a random Qwen3-MoE checkpoint, convert it
# to the 75%-sparse samoyeds format, serve it with `vllm serve` and query it through the OpenAI client.
# Output goes to ${1:-./demo-out}.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/env.sh" | tail -n 1)"
OUT="$(mkdir -p "${1:-demo-out}" && cd "${1:-demo-out}" && pwd)"
CLI="$VENV/bin/samoyeds-vllm"
"$CLI" make-model --arch qwen3_moe --preset tiny --out "$OUT/dense" --force
"$CLI" convert "$OUT/dense" "$OUT/sparse" --pattern samoyeds --export-dense "$OUT/pruned" --force
cd "$OUT"
"$VENV/bin/python" "$ROOT/examples/serve_and_query.py" "$OUT/sparse"
