#!/bin/bash
# Serving, Qwen3-30B-A3B shape, dummy weights, 4 API servers (bench e2e's default): VARIANTS at CONC clients,
# PPC timed requests per client; results accumulate in /tmp/srv across calls on one machine.
set -u
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version,memory.used --format=csv,noheader
mkdir -p /tmp/srv
cd /tmp && timeout -s TERM ${BUDGET:-560} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/srv --variants $VARIANTS \
  --stages serving --concurrency $CONC --prompts-per-client $PPC >> /tmp/srv/run.log 2>&1
echo rc=$?
(cd /tmp/srv && tar czf $OUT/srv.tgz --exclude=models .)
tail -2 /tmp/srv/run.log | cut -c1-300; grep -B2 -A12 "TPOT p50" /tmp/srv/results.md | head -40

# Calls of 2026-11-27 (one H200, main at fc03e88), in order, results accumulating in /tmp/srv on one machine:
#   VARIANTS=samoyeds-fp8,dense-fp8,dense CONC=1 PPC=16 BUDGET=575   (dense bf16 cut off by the budget)
#   VARIANTS=dense CONC=1 PPC=16 BUDGET=570                          -> one-client/
#   VARIANTS=samoyeds-fp8,dense-fp8 CONC=16,64,256 PPC=4 BUDGET=580  (cut off in dense FP8's 64-client level)
#   VARIANTS=dense-fp8 CONC=64,256 PPC=4 BUDGET=290                  (cut off in dense FP8's 256-client re-runs:
#     its one timed run there compiled Triton MoE kernels, so serve-dense-fp8-c256.json is not a steady state)
