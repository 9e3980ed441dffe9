# One H200 (143771 MiB, driver 580.159.04), 2026-11-27, vLLM 0.26.0, torch 2.11.0+cu130; after the unpack calls.
# Trees: old = main at 2961f80, new = the one-token kernels (branch next/one-token at 7053651), each
# `git archive REV samoyeds_vllm csrc configs` with csrc/ and configs/ moved into samoyeds_vllm/:
python3 benchmarks/ab_moe.py --tree old=/tmp/old --tree new=/tmp/one \
  --run qwen3-30b-a3b:1,2 --run mixtral-8x7b:1 --values fp8 --rounds 2 --out /tmp/ab   # summary.txt, ab.log
# GPU tests (tests.log), the same day on another H200 of the same kind, the tree of 7053651 as the working tree:
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py \
  -k "one_token_kernels or few_tokens or cuda_graph or split_k or fresh or (every_shape and (1-samoyeds or 1-2:4)) or (test_fp8_values and -1-)"
