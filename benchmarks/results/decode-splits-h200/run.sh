#!/bin/bash
# Burst 3, call 4: split-K factors at decode on main (H200, FP8 values), and tables of the clear winners in /tmp/tables.
set -u
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
repo=$PWD
rm -rf /tmp/written /tmp/tables && mkdir -p /tmp/tables
cd /tmp
timeout 250 python3 $repo/benchmarks/tune_kernels.py --shapes qwen3-30b-a3b --patterns samoyeds --tokens 1,2,3,4,5,6,8 \
  --search splits --values fp8 --json $OUT/tune-qwen3.json --write-tables /tmp/written 2>&1 | grep -v Warn | tail -12 | tee $OUT/tune.log
timeout 250 python3 $repo/benchmarks/tune_kernels.py --shapes mixtral-8x7b --patterns samoyeds --tokens 1,2,3,4,6,8,12,16 \
  --search splits --values fp8 --json $OUT/tune-mixtral.json --write-tables /tmp/written 2>&1 | grep -v Warn | tail -12 | tee -a $OUT/tune.log
python3 $repo/.ab/b3-tables.py $repo /tmp/written /tmp/tables $OUT/tune-qwen3.json $OUT/tune-mixtral.json | tee $OUT/tables.log
mkdir -p $OUT/tables && cp /tmp/tables/* $OUT/tables/
#!/bin/bash
# Burst 3, call 5: main's heuristics against the tables of call 4 (SAMOYEDS_KERNEL_CONFIG_DIR=/tmp/tables), the same
# tree, bench moe --no-vllm --values fp8 (bf16 values: no table, a control), alternating, two rounds.
set -u
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
ls /tmp/tables
timeout 570 python3 benchmarks/ab_moe.py --tree heuristics= --tree tables= --env tables:SAMOYEDS_KERNEL_CONFIG_DIR=/tmp/tables \
  --run qwen3-30b-a3b:1,2,3,4,5,6,8,12,16 --run mixtral-8x7b:1,2,3,4,6,8,12,16,24,32 --values fp8 --rounds 2 --out /tmp/ab3 2>&1 | tail -3
cp /tmp/ab3/summary.txt $OUT/summary.txt; tar -czf $OUT/ab-json.tgz -C /tmp/ab3 .
cat $OUT/summary.txt
