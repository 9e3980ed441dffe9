#!/bin/bash
# The block search of Mixtral-8x7B 2:4 with FP8 values at T = 16 in 16-token tiles, on one H200 (143771 MiB, driver
# 580.159.04), 2026-11-29 00:50-00:51, main at 411eb8f, vLLM 0.26.0, torch 2.11.0+cu130, after ../ws-prefetch-ab-h200/
# in the same call. The blocks found best make the plan the shipped table's T = 16 entry already makes.
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e .
python3 benchmarks/tune_kernels.py --shapes mixtral-8x7b --patterns 2:4 --values fp8 --tokens 16 --search blocks \
  --token-tile 16 --json tune.json --write-tables tables > tune.log
