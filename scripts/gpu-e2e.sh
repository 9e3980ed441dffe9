#!/usr/bin/env bash
# On a GPU machine with vLLM (see ../shared/device: source /tmp/vllm-env.sh first): a tiny converted model in
# vLLM with CUDA graphs and our kernels, the same in eager mode through the reference op, then `vllm serve`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-out}"
W="$(mktemp -d)"
cd "$ROOT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -m samoyeds_vllm.cli make-model --arch qwen3_moe --preset tiny --out "$W/dense" --dtype bfloat16 >/dev/null
python3 -m samoyeds_vllm.cli convert "$W/dense" "$W/sparse" --pattern samoyeds >/dev/null
export PYTHONUNBUFFERED=1
timeout 300 python3 examples/offline_generate.py "$W/sparse" --compile --json-out "$OUT/e2e-kernels-graphs.json" \
  > "$OUT/e2e-kernels.log" 2>&1 || { tail -40 "$OUT/e2e-kernels.log"; exit 1; }
grep -E "CUDA graph|cudagraph_mode|->" "$OUT/e2e-kernels.log" | tail -5
SAMOYEDS_FORCE_REFERENCE=1 timeout 300 python3 examples/offline_generate.py "$W/sparse" \
  --json-out "$OUT/e2e-reference-eager.json" > "$OUT/e2e-reference.log" 2>&1 || { tail -40 "$OUT/e2e-reference.log"; exit 1; }
python3 - "$OUT" <<'PY'
import json, sys
a = json.load(open(f"{sys.argv[1]}/e2e-kernels-graphs.json")); b = json.load(open(f"{sys.argv[1]}/e2e-reference-eager.json"))
for x, y in zip(a, b):
    same = sum(p == q for p, q in zip(x["token_ids"], y["token_ids"]))
    print(f"{x['prompt']!r}: kernels+graphs vs reference: {same}/{len(x['token_ids'])} tokens equal")
PY
cp "$W/dense/config.json" "$OUT/e2e-model-config.json"
cd "$OUT" && timeout 300 python3 "$ROOT/examples/serve_and_query.py" "$W/sparse" 2>&1 | tail -5
