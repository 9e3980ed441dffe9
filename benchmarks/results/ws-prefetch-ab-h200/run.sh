#!/bin/bash
# Two kernel branches against main (411eb8f) on one H200 (143771 MiB, driver 580.159.04), 2026-11-29 00:38-00:50,
# vLLM 0.26.0, torch 2.11.0+cu130, in the call after the bundle's unpack and the next one. Trees: main (the installed
# checkout); pre = main + prefetch.diff (`git diff main ws-prefetch`: the ws copier reads the next item's tile record
# while it copies the current one, and with FP8 values the MMA warps load their rows' scales when an item starts);
# route = main + route.diff (`git diff main route-held`: the one-block routing index keeps each thread's ids and
# weights in registers from the count to the placement). csrc/ and configs/ moved into each tree's package.
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e .
R=$PWD
for t in pre:prefetch route:route; do n=${t%%:*}; d=${t##*:}
  mkdir -p /tmp/$n && cp -r samoyeds_vllm csrc configs tests pyproject.toml /tmp/$n/ &&
    (cd /tmp/$n && patch -p1 -s < $R/benchmarks/results/ws-prefetch-ab-h200/$d.diff) &&
    mv /tmp/$n/csrc /tmp/$n/configs /tmp/$n/samoyeds_vllm/
done
# gpu-tests-*.log: each tree's kernel tests of what it changed, stopped by their time limits (170 s, 120 s) with
# 135 and 101 passed and none failed (the output is pytest's progress dots only)
(cd /tmp/pre && PYTHONPATH=/tmp/pre:$PYTHONPATH timeout 170 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_kernels.py -k "ws or wide or 256 or 300 or fp8 or largest or fresh")
(cd /tmp/route && PYTHONPATH=/tmp/route:$PYTHONPATH timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_routing_cuda.py tests/gpu/test_kernels.py -k "routing or routings or fresh or every_shape or split")
# summary.txt, ab-*/: bench moe --no-vllm of each tree, trees alternating, two rounds, bf16 and FP8 values, samoyeds
python3 benchmarks/ab_moe.py --tree main= --tree pre=/tmp/pre --tree route=/tmp/route \
  --run qwen3-30b-a3b:16,64,256,512,1024,4096 --values fp8 --rounds 2 --out ab-qwen3
python3 benchmarks/ab_moe.py --tree main= --tree pre=/tmp/pre --tree route=/tmp/route \
  --run mixtral-8x7b:16,64,256,4096 --values fp8 --rounds 2 --out ab-mixtral
