#!/bin/bash
# As run on one H100 80GB HBM3 (driver 580.159.04), 2026-12-07 19:36-19:45 UTC, vLLM 0.26.0 (the device bundle), torch
# 2.11.0+cu130, main at 2d0c8bc (kernels as be062d5), harness 5, in one call on one machine: dense bf16 (vLLM's
# Triton MoE) then samoyeds FP8, each served to one client (.ab/e2e.sh: `samoyeds-vllm bench e2e --out DIR --variants
# V --stages serving --concurrency 1`, both into one DIR, so results.md has the two side by side). The dense call's
# own limit (270 s) ended it during the server's shutdown, after its level had finished (logs/call.txt: rc=124; the
# level's three rounds are in variant-dense.json, jit_free and steady).
samoyeds-vllm bench e2e --out e2e --variants dense --stages serving --concurrency 1
samoyeds-vllm bench e2e --out e2e --variants samoyeds-fp8 --stages serving --concurrency 1
