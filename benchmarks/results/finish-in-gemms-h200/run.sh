# The device calls of the run, in order (after the three unpack calls), on the tree with change.diff applied:

# ---- b2-tests.sh
#!/bin/bash
# Burst 2, call 4: the working tree's GPU tests around the reductions in the GEMMs.
set -u
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 540 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_kernels.py \
  -k "reductions or few_tokens or cuda_graph or split_k or fresh or routings or (every_shape and (1-samoyeds or 1-2:4 or 7-samoyeds or 7-2:4)) or (test_fp8_values and (-1- or -7-))" \
  2>&1 | tail -25 | tee $OUT/tests.log

# ---- b2-ab.sh
#!/bin/bash
# Burst 2, call 5: main (old) against the change (new: reductions in the GEMMs up to 32 slots), bench moe --no-vllm --values fp8, alternating, two rounds.
set -u
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
rm -rf /tmp/old /tmp/new64 && mkdir -p /tmp/old /tmp/new64 && tar -xf .ab/old.tar -C /tmp/old && tar -xf .ab/new64.tar -C /tmp/new64
timeout 560 python3 benchmarks/ab_moe.py --tree old=/tmp/old --tree new= \
  --run qwen3-30b-a3b:1,2,3,4,8,16 --run mixtral-8x7b:1,4,8,16 --values fp8 --rounds 2 --out $OUT/ab 2>&1 | tail -5
cat $OUT/ab/summary.txt

# ---- b2-tune.sh
#!/bin/bash
# Burst 2, call 6: split-K factors at decode with the reductions in the GEMMs (working tree).
set -u
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
repo=$PWD
cd /tmp && timeout 500 python3 $repo/benchmarks/tune_kernels.py --shapes qwen3-30b-a3b,mixtral-8x7b --patterns samoyeds \
  --tokens 1,2,4,8 --search splits --values fp8 --json $OUT/tune-splits.json 2>&1 | tail -20 | tee $OUT/tune.log
cd $repo && rm -rf /tmp/old /tmp/new64 && mkdir -p /tmp/old /tmp/new64 && tar -xf .ab/old.tar -C /tmp/old && tar -xf .ab/new64.tar -C /tmp/new64
timeout 200 python3 benchmarks/ab_moe.py --tree old=/tmp/old --tree new= --tree new64=/tmp/new64 \
  --run qwen3-30b-a3b:8 --values fp8 --rounds 2 --out $OUT/ab64 2>&1 | tail -3
cat $OUT/ab64/summary.txt
cd /tmp && timeout 80 python3 $repo/benchmarks/profile_moe.py --shape qwen3-30b-a3b --pattern samoyeds --tokens 1 --values fp8 2>&1 | grep -v Warning | tee $OUT/profile.log
