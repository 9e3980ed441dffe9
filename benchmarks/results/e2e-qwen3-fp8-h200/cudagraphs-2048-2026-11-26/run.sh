#!/bin/bash
# c16, 4 API servers, CUDA graphs captured up to 2048 tokens, both FP8 variants (untracked helper)
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/pip.log 2>&1
mkdir -p /tmp/cg
timeout -s TERM ${BUDGET:-560} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/cg --variants ${VARIANTS:-samoyeds-fp8,dense-fp8} \
  --stages serving --concurrency 16 --prompts-per-client 16 \
  "--engine-args=--compilation-config='{\"max_cudagraph_capture_size\":2048}'" > /tmp/cg/run.log 2>&1
echo rc=$?
tail -3 /tmp/cg/run.log
(cd /tmp/cg && tar czf $OUT/cg.tgz --exclude=models .)
