# One H200 (143771 MiB, driver 580.159.04), 2026-11-27, vLLM 0.26.0, torch 2.11.0+cu130; after the three unpack calls:
#   bash .ab/l2-tests.sh   (the change with both prefetches on, PREFETCHED = 0b110: test_kernels.py -k "few_tokens or
#                           cuda_graph or fresh or split_k or every_shape at 1 / 7 tokens or fp8_values at 1 / 7": tests.log)
#   bash .ab/l2-ab.sh      (summary.txt)
# l2-ab.sh: trees old = main at 997994a, new = the change (change.diff; PREFETCHED = 0b10: the routing index
# prefetches the down weights), own = 0b100 (each 8-token-tile block prefetches its own share), both = 0b110:
python3 benchmarks/ab_moe.py --tree old=/tmp/old --tree new= --tree own=/tmp/own --tree both=/tmp/both \
  --run qwen3-30b-a3b:1,2,4 --run mixtral-8x7b:1 --values fp8 --rounds 2 --out /tmp/ab
