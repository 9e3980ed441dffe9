#!/bin/bash
# TTFT split at 1/16/64 clients, 16 timed requests per client, both FP8 variants (untracked helper)
set -x
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/pip.log 2>&1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
mkdir -p /tmp/ttft
timeout -s TERM ${BUDGET:-560} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/ttft --variants ${VARIANTS:-samoyeds-fp8,dense-fp8} \
  --stages serving --concurrency 1,16,64 --prompts-per-client 16 > /tmp/ttft/run.log 2>&1
echo rc=$?
(cd /tmp/ttft && tar czf $OUT/ttft.tgz --exclude=models .)
tail -5 /tmp/ttft/run.log
ls /tmp/ttft
