#!/bin/bash
# As run on one H200 (143771 MiB, driver 580.159.04), 2026-11-29 06:18-06:46, vLLM 0.26.0, torch 2.11.0+cu130, after
# the bundle's unpack (the device tool's README). Four device calls; each sourced a setup that ran
# `source /tmp/vllm-env.sh && python3 -m pip install --no-deps --no-build-isolation -e .` and set
# CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1.
# Trees (csrc/ and configs/ moved into each package): main = main at 77fcf2a (`git archive`), pre = main with pre.diff
# applied (`git diff main 6fe4355 -- csrc samoyeds_vllm/kernels`: the kernels before the three merges c2fc68b, 2cbe31d,
# 9eb62dc), drain = the installed checkout of branch ws-drain-late (main + drain.diff).

# call 1 (06:18-06:25): the layer, three trees alternating, two rounds (ab-main-pre-drain/)
python3 benchmarks/ab_moe.py --tree main=$PWD/.ab/trees/main --tree pre=$PWD/.ab/trees/pre --tree drain= \
  --run qwen3-30b-a3b:256,4096 --run mixtral-8x7b:256 --values fp8 --rounds 2 --out ab-main-pre-drain

# calls 2 and 3 (06:25-06:38, checkout at main 77fcf2a): served, FP8 against FP8, each variant's server alone on the
# GPU, one after the other (serving/; off.sh is ../e2e-mixes-h200/off.sh)
MODEL=qwen3-30b-a3b VARIANTS=samoyeds-fp8 DIR=sv TL=540 bash .ab/off.sh --stages serving --concurrency 16,64,256
MODEL=qwen3-30b-a3b VARIANTS=dense-fp8 DIR=sv TL=560 bash .ab/off.sh --stages serving --concurrency 16,64,256

# call 4 (06:38-06:46): main's GPU tests until the call's limit (gpu-tests-main.log: pytest's progress only)
timeout 480 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py tests/gpu/test_routing_cuda.py \
  tests/gpu/test_bench_routing_cuda.py tests/gpu/test_sparse_mma_layouts.py tests/gpu/test_copy_bandwidth_runs.py \
  tests/gpu/test_fp8_onload.py tests/gpu/test_deepseek_vllm.py tests/gpu/test_parallel.py --durations=15 -rfEs
