#!/bin/bash
# The slot sum in pairs (this commit's csrc/reduce.cuh and kernels/plan.py) against main before it (4e16755), on one
# H200 (143771 MiB, driver 580.159.04), 2026-11-28 22:20-22:26, vLLM 0.26.0, torch 2.11.0+cu130, in the call after
# the bundle's unpack. The new tree is main plus the change (`git diff main sum-vec2`, as .ab/sumvec.diff) with
# csrc/ and configs/ moved into the package; the old one is the installed checkout.
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e .
R=$PWD
mkdir -p /tmp/b && cp -r samoyeds_vllm csrc configs tests pyproject.toml /tmp/b/ && (cd /tmp/b && patch -p1 -s < $R/.ab/sumvec.diff)
mv /tmp/b/csrc /tmp/b/configs /tmp/b/samoyeds_vllm/
# gpu-tests.log: the new tree's kernel tests of the pairs and of the token counts around the switch
(cd /tmp/b && PYTHONPATH=/tmp/b:$PYTHONPATH python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py \
  -k "pairs or 256 or 300")
# summary.txt, ab.log, ab/: bench moe --no-vllm, trees alternating, two rounds, bf16 and FP8 values
python3 benchmarks/ab_moe.py --tree main= --tree vec2=/tmp/b --run qwen3-30b-a3b:128,256,512 --run mixtral-8x7b:256 \
  --values fp8 --rounds 2 --out /tmp/k2/ab
# then, the call's remaining 170 s: the rest of the new tree's kernel tests, stopped by the time limit after 53
# passed and none failed (-x; the output was only pytest's progress dots)
(cd /tmp/b && PYTHONPATH=/tmp/b:$PYTHONPATH timeout 170 python3 -m pytest -q -x -p no:cacheprovider \
  tests/gpu/test_kernels.py -k "not (pairs or 256 or 300)")
