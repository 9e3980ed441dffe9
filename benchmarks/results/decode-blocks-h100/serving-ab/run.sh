#!/bin/bash
# A/B on one machine: samoyeds FP8 served at 16 / 64 clients with the decode blocks preferred before the wave rule
# (a tuned table forcing them, oldrule/ then, preferred-blocks-table/ here) and with the rule, at commit 2190779
# (the rule before TAIL_GAIN: the same plans at decode batches up to 64 tokens; untracked helper then)
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
D=/tmp/ab-$WHICH; mkdir -p $D
if [ "$WHICH" = old ]; then export SAMOYEDS_KERNEL_CONFIG_DIR=$PWD/oldrule; fi
timeout -s TERM 560 samoyeds-vllm bench e2e --model qwen3-30b-a3b --out $D --variants samoyeds-fp8 \
  --stages serving --concurrency 16,64 --prompts-per-client 16 >> $D/run.log 2>&1
echo rc=$?
grep -h "kernel config\|tuned" $D/server-samoyeds-fp8.log | head -3
(cd $D && tar czf $OUT/ab-$WHICH.tgz --exclude=models .)
grep -A4 "output tokens/s" $D/results.md | head -6; grep -A4 "TPOT p50" $D/results.md | head -6
