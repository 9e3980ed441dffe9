#!/bin/bash
# Serving at 16 / 64 clients, 16 timed requests per client, both FP8 variants, after the decode block rule (untracked helper)
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p /tmp/e2e
if [ ! -f /tmp/e2e/tests.done ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "close_to_their or refused" 2>&1 | tail -3
  touch /tmp/e2e/tests.done
fi
timeout -s TERM ${BUDGET:-540} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/e2e --variants ${VARIANTS:-samoyeds-fp8,dense-fp8} \
  --stages serving --concurrency 16,64 --prompts-per-client 16 >> /tmp/e2e/run.log 2>&1
echo rc=$?
(cd /tmp/e2e && tar czf $OUT/e2e.tgz --exclude=models .)
tail -4 /tmp/e2e/run.log
