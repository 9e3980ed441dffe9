#!/bin/bash
# As run on one H100 80GB HBM3 (driver 580.159.04), 2026-12-07 18:42-18:45 UTC, torch 2.11.0+cu130, CuPy 14.2.0, no
# vLLM (bench moe --no-vllm), main at 2d0c8bc. Trees: /tmp/main (main's samoyeds_vllm with csrc/ and configs/ inside)
# and /tmp/change (the same with change.diff applied: branch route-ranked).
python3 benchmarks/ab_moe.py --tree main=/tmp/main --tree change=/tmp/change \
  --run qwen3-30b-a3b:64,128,256,1024 --run mixtral-8x7b:64,256 --values fp8 --rounds 2 --out ab   # summary.txt
# the index alone at T = 256 under Nsight Compute, caches flushed between replays (ncu's default), each tree:
for t in main change; do
  PYTHONPATH=/tmp/$t SAMOYEDS_LINEINFO=1 ncu --clock-control none --profile-from-start off \
    -k regex:build_routing_index --set full --import-source yes -o idx-$t -f \
    python3 benchmarks/ncu_moe.py --tokens 256 --values fp8
  ncu --import idx-$t.ncu-rep --page details > ncu-index-$t.txt
done
