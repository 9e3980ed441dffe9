#!/bin/bash
# Dense bf16 served at one client, 16 timed requests, 4 API servers (the harness of the FP8 runs): TPOT at one client
# against samoyeds FP8's on the H200s of ttft-split-2026-11-26/ and serving-4-api-servers/ (untracked helper)
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p /tmp/e2e
timeout -s TERM ${BUDGET:-560} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/e2e --variants dense \
  --stages serving --concurrency 1 --prompts-per-client 16 >> /tmp/e2e/run.log 2>&1
echo rc=$?
(cd /tmp/e2e && tar czf $OUT/e2e.tgz --exclude=models .)
tail -3 /tmp/e2e/run.log; grep -A5 "TPOT p50\|output tokens/s" /tmp/e2e/results.md | grep "^| [0-9]"
