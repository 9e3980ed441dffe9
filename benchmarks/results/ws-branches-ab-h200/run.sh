#!/bin/bash
# Six kernel branches against main (1b6b3d3; kernels as at 411eb8f) on one H200 (143771 MiB, driver 580.159.04),
# 2026-11-29 03:45-04:10, vLLM 0.26.0, torch 2.11.0+cu130, three calls after the bundle's unpack (the device tool's
# README). Each tree is main's with `git diff main...BRANCH` applied (*.diff here), csrc/ and configs/ moved into its
# package: rec = record.diff (ws-record-ahead), pads (skip-pads), scales (ws-scales-smem), trig = trigger.diff
# (route-trigger), bulk (ws-bulk), sum (sum-speculative), every (all six, branch every), four = record + trigger +
# sum + pads. gpu-tests-*.log: kernel tests of the ws GEMM, the index and FP8 values in a tree, stopped by their time
# limits (pytest's progress dots only: none failed).
source /tmp/vllm-env.sh && python3 -m pip install -q --no-deps --no-build-isolation -e .
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
R=$PWD/benchmarks/results/ws-branches-ab-h200
trees() {  # NAME:DIFF[+DIFF...] ...
  for spec in "$@"; do n=${spec%%:*}; diffs=${spec#*:}
    mkdir -p /tmp/$n && cp -r samoyeds_vllm csrc configs tests benchmarks pyproject.toml /tmp/$n/
    for d in ${diffs//+/ }; do (cd /tmp/$n && patch -p1 -s < $R/$d.diff); done
    mv /tmp/$n/csrc /tmp/$n/configs /tmp/$n/samoyeds_vllm/
  done
}
gpu_tests() {  # TREE SECONDS
  (cd /tmp/$1 && PYTHONPATH=/tmp/$1:$PYTHONPATH timeout $2 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_kernels.py \
    -k "ws or wide or 256 or 300 or fp8 or largest or fresh or routing or graph or elsewhere")
}
# call 1 (also benchmarks/results/copy-bandwidth-h200/)
trees rec:record pads:pads scales:scales trig:trigger bulk:bulk sum:sum every:every
python3 benchmarks/copy_bandwidth.py --json copy.json
python3 benchmarks/ab_moe.py --tree main= --tree rec=/tmp/rec --tree pads=/tmp/pads --tree scales=/tmp/scales \
  --tree trig=/tmp/trig --tree bulk=/tmp/bulk --tree sum=/tmp/sum --tree every=/tmp/every \
  --run qwen3-30b-a3b:256 --values fp8 --rounds 2 --out ab-qwen3-256-eight-trees
gpu_tests every 150  # what was left of the call: ~150, ~215, ~215 s
# call 2
trees four:record+trigger+sum+pads
python3 benchmarks/ab_moe.py --tree main= --tree four=/tmp/four --tree rec=/tmp/rec \
  --run qwen3-30b-a3b:64,4096 --run mixtral-8x7b:256,4096 --values fp8 --rounds 2 --out ab-four-rec
gpu_tests four 215
# call 3
python3 benchmarks/ab_moe.py --tree main= --tree trig=/tmp/trig --tree sum=/tmp/sum \
  --run qwen3-30b-a3b:64,4096 --run mixtral-8x7b:256,4096 --values fp8 --rounds 2 --out ab-trig-sum
gpu_tests rec 215
