#!/bin/bash
# c16 with vLLM's per-iteration log (one API server: with several, vLLM does not log iterations), both FP8 variants
source /tmp/vllm-env.sh
mkdir -p /tmp/iter
timeout -s TERM ${BUDGET:-560} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/iter --variants samoyeds-fp8,dense-fp8 \
  --stages serving --concurrency 16 --prompts-per-client 16 --api-servers 1 \
  --engine-args=--enable-logging-iteration-details > /tmp/iter/run.log 2>&1
