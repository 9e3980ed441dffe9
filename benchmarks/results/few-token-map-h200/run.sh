#!/bin/bash
# GEMM 1 of a few tokens working its tile map out from topk_ids (csrc/few_tokens.cuh), with the tile map as one
# 16-byte record per tile and the routing weight by sorted position; H200, 2026-11-27. Four device calls, in order:
# 1. the 64-slot shared-memory version (4498ab1): all of test_kernels.py (tests-64-slots.log), then
# 2. it against main (222ed16) (ab-64-slots.txt), 3. against the same with GEMM 1 mapping itself only to 32 slots
# (plan edited) and main (ab-32-or-64-slots.txt), 4. the one-warp version (this tree, <= 32 slots): the tests
# below (tests.log) and the A/B against 4498ab1 and main (summary.txt, ab-json.tgz). Steps 1-3 ran the scripts
# below with the trees named there; .ab/*.tar came from `git archive REV samoyeds_vllm csrc configs`.

# step 1
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
git log --oneline -1 2>/dev/null | tee $OUT/rev.txt
timeout 540 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py 2>&1 | tail -40 > $OUT/tests.log
tail -15 $OUT/tests.log

# step 2
mkdir -p /tmp/main && tar -xf .ab/main.tar -C /tmp/main && mv /tmp/main/csrc /tmp/main/configs /tmp/main/samoyeds_vllm/
timeout 560 python3 benchmarks/ab_moe.py --tree main=/tmp/main --tree combined= \
  --run qwen3-30b-a3b:1,2,4,8,16,256,4096 --run mixtral-8x7b:1,8,1024 --values fp8 --out /tmp/ab 2>&1 | tail -5
tar -czf $OUT/ab.tgz -C /tmp ab; cp /tmp/ab/summary.txt $OUT/
cat $OUT/summary.txt

# step 3
mkdir -p /tmp/main && tar -xf .ab/main.tar -C /tmp/main && mv /tmp/main/csrc /tmp/main/configs /tmp/main/samoyeds_vllm/
mkdir -p /tmp/s32 && cp -r samoyeds_vllm /tmp/s32/ && cp -r csrc configs /tmp/s32/samoyeds_vllm/
sed -i 's/shape.slots <= FEW_TOKEN_SLOTS/shape.slots <= 32/' /tmp/s32/samoyeds_vllm/kernels/plan.py
grep -n "shape.slots <=" /tmp/s32/samoyeds_vllm/kernels/plan.py
timeout 560 python3 benchmarks/ab_moe.py --tree s64= --tree s32=/tmp/s32 --tree main=/tmp/main \
  --run qwen3-30b-a3b:1,2,4,6,8,16 --run mixtral-8x7b:1,4,8 --values fp8 --rounds 2 --out /tmp/ab 2>&1 | tail -5
tar -czf $OUT/ab.tgz -C /tmp ab; cp /tmp/ab/summary.txt $OUT/
cat $OUT/summary.txt

# step 4
for t in main s64; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .ab/$t.tar -C /tmp/$t && mv /tmp/$t/csrc /tmp/$t/configs /tmp/$t/samoyeds_vllm/
done
timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py \
  -k "few_tokens or graph or (every_shape and (-1- or -7-)) or (test_fp8_values and -1-) or routings" 2>&1 | tail -30 > $OUT/tests.log
tail -4 $OUT/tests.log
timeout 560 python3 benchmarks/ab_moe.py --tree warp= --tree s64=/tmp/s64 --tree main=/tmp/main \
  --run qwen3-30b-a3b:1,2,3,4,5,8 --run mixtral-8x7b:1,4,8 --values fp8 --rounds 2 --out /tmp/ab 2>&1 | tail -3
tar -czf $OUT/ab.tgz -C /tmp ab; cp /tmp/ab/summary.txt $OUT/
cat $OUT/summary.txt
