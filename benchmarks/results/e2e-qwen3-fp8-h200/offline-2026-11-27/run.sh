#!/bin/bash
set -u
source /tmp/vllm-env.sh
nvidia-smi --query-gpu=memory.used --format=csv,noheader
cd /tmp && timeout 580 samoyeds-vllm bench e2e --quick --variants ${VARIANTS:-samoyeds-fp8,dense-fp8} --out /tmp/e2e-h200 > $OUT/run-offline.log 2>&1
echo rc=$?
mkdir -p $OUT/e2e && cp -r /tmp/e2e-h200/*.md /tmp/e2e-h200/*.json /tmp/e2e-h200/*.jsonl /tmp/e2e-h200/*.log /tmp/e2e-h200/*.png $OUT/e2e/ 2>/dev/null
cat /tmp/e2e-h200/results.md 2>/dev/null | head -30
