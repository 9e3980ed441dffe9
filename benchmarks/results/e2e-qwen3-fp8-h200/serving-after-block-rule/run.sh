#!/bin/bash
# Serving at 16 / 64 clients, 16 timed requests per client, both FP8 variants, vLLM's default CUDA graphs, main at
# 61020f0 (the decode block rule). Resumes in /tmp/e2e on a warm machine (untracked helper).
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p /tmp/e2e
timeout -s TERM ${BUDGET:-560} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/e2e --variants ${VARIANTS:-samoyeds-fp8,dense-fp8} \
  --stages serving --concurrency 16,64 --prompts-per-client 16 >> /tmp/e2e/run.log 2>&1
echo rc=$?
(cd /tmp/e2e && tar czf $OUT/e2e.tgz --exclude=models .)
tail -5 /tmp/e2e/run.log
grep -A5 "output tokens/s" /tmp/e2e/results.md 2>/dev/null | head -8
