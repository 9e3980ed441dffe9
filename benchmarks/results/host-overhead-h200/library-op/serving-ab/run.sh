#!/bin/bash
# STEP=tests: GPU tests not run yet of the kernels, then plans of both trees with the GPU's occupancy;
# STEP=serve WHICH=old|new: samoyeds FP8 served at 16 / 64 clients from main before this session (61020f0) or now
# (untracked helper)
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p /tmp/old && tar xzf ab_old.tgz -C /tmp/old
R=$PWD
if [ "$STEP" = tests ]; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py \
    -k "either_gemm or zero_rows or before_hopper or close_to_their or refused or checkpoint_order" 2>&1 | tail -4
  timeout 200 python3 abtools/dump_plans.py > $OUT/plans-new.txt 2>&1
  (cd /tmp && PYTHONPATH=/tmp/old:$PYTHONPATH timeout 200 python3 $R/abtools/dump_plans.py > $OUT/plans-old.txt 2>&1)
  head -1 $OUT/plans-old.txt $OUT/plans-new.txt; diff $OUT/plans-old.txt $OUT/plans-new.txt | head -40
fi
if [ "$STEP" = serve ]; then
  D=/tmp/ab-$WHICH; mkdir -p $D
  if [ "$WHICH" = old ]; then export PYTHONPATH=/tmp/old:$PYTHONPATH; fi
  (cd /tmp && python3 -c "import samoyeds_vllm; print('tree', samoyeds_vllm.__file__)" && timeout -s TERM ${BUDGET:-560} samoyeds-vllm bench e2e --model qwen3-30b-a3b --out $D --variants samoyeds-fp8 \
    --stages serving --concurrency 16,64 --prompts-per-client 16 >> $D/run.log 2>&1)
  echo rc=$?
  grep -m3 "samoyeds_vllm\|tree" $D/server-samoyeds-fp8.log | head -3
  (cd $D && tar czf $OUT/ab-$WHICH.tgz --exclude=models .)
  grep -A4 "output tokens/s" $D/results.md | head -6; grep -A4 "TTFT p50" $D/results.md | head -6
fi
