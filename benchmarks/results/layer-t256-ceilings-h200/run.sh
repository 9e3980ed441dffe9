#!/bin/bash
# As run on one H200 (143771 MiB, driver 580.159.04), 2026-11-29 09:17-09:45, vLLM 0.26.0, torch 2.11.0+cu130,
# CuPy 14.2.0, after the bundle's unpack (the device tool's README). Each call sourced a setup that ran
# `source /tmp/vllm-env.sh && python3 -m pip install --no-deps --no-build-isolation -e .` and set
# CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1. The installed checkout: main at e2cf3e4 (calls 1-2), main + the
# problems' routing without vLLM, 5db40a1 (calls 3-5).

# call 1 (09:17-09:22): main against branch ws-early-weights (early.diff), the layer, two rounds (ab-main-early/)
python3 benchmarks/ab_moe.py --tree main= --tree early=$PWD/early.diff \
  --run qwen3-30b-a3b:16,256,4096 --run mixtral-8x7b:16,256 --values fp8 --rounds 2 --out ab-main-early

# call 2 (09:22-09:27): ceilings, timing only: main with kernels left out of the forward (skip.diff: SAMOYEDS_SKIP
# names the launches left out; the output is then wrong, the error column says so) (ab-skip/); then phases.py,
# where a bench process's time goes before its first timing (phases-before.log)
S=$PWD/skip.diff
python3 benchmarks/ab_moe.py --tree main= --tree qact=$S --tree sum=$S --tree qx=$S --tree all3=$S \
  --env qact:SAMOYEDS_SKIP=qact --env sum:SAMOYEDS_SKIP=sum --env qx:SAMOYEDS_SKIP=qx \
  --env all3:SAMOYEDS_SKIP=qx,qact,sum --run qwen3-30b-a3b:64,256 --values fp8 --rounds 2 --out ab-skip
python3 phases.py > phases-before.log

# call 3 (09:28, a fresh machine that had released the last one: no vLLM bundle, no CuPy cache, so the kernels
# compiled in their first runs): phases.py with 5db40a1 (phases-after.log)
python3 phases.py > phases-after.log

# calls 4-5 (09:31-09:45, bundle unpacked again): 5db40a1's GPU tests, each file set until its limit
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_routing_cuda.py tests/gpu/test_bench_routing_cuda.py \
  tests/gpu/test_sparse_mma_layouts.py tests/gpu/test_copy_bandwidth_runs.py tests/gpu/test_fp8_onload.py \
  tests/gpu/test_deepseek_vllm.py tests/gpu/test_parallel.py -rfEs   # gpu-tests-other.log (cut at 200 s)
timeout 320 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -rfE     # first part of gpu-tests-kernels.log
python3 -m pytest --co -q tests/gpu/test_kernels.py | grep :: > ids
python3 -m pytest -q -p no:cacheprovider $(tail -n 185 ids) -rfE                        # the rest: 185 passed
