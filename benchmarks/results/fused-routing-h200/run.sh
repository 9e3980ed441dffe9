# One H200 (143771 MiB, driver 580.159.04) per batch of calls, 2026-11-27, vLLM 0.26.0, torch 2.11.0+cu130; after
# the unpack calls. Two trees of the change: "first" (the in-kernel top-k in both GEMMs, every slot's routing
# running all top_k rounds and the softmax) on machine A, "final" (GEMM 1 stops at its own slot and skips the
# softmax: the commit that added this folder) on machine B. "old" is main at 6e637e5, `git archive` of samoyeds_vllm
# csrc configs with csrc/ and configs/ moved into samoyeds_vllm/, first on PYTHONPATH; "new" the working tree.
#
# GPU tests. first (tests-first.log; the call's 560 s ran out at 135 of the 136 selected, all passed, the last of
# test_fp8_onload.py not reached):
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py tests/gpu/test_routing_cuda.py \
  tests/gpu/test_bench_routing_cuda.py tests/gpu/test_fp8_onload.py \
  -k "routes_its_logits or one_token_kernels or few_tokens or cuda_graph or routing or onload or fp8_checkpoint"
# final, two calls (tests-kernels.log: 51 passed; tests-engines.log: vLLM engines through the op, 3 passed):
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py tests/gpu/test_bench_routing_cuda.py \
  -k "routes_its_logits or one_token_kernels or cuda_graph or bench_routing"
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_onload.py
# The layer with its routing (routing-ab-*/), old and new alternating, two rounds (routing-TREE-ROUND.json):
samoyeds-vllm bench routing --shape qwen3-30b-a3b --routing softmax --tokens 1,2 --json routing-TREE-ROUND.json
# Serving at one client (serving-c1-*/), the Qwen3-30B-A3B shape, 4 API servers, 16 timed requests after an untimed
# round of 16; first: samoyeds FP8 then dense bf16 on machine A; final: samoyeds FP8 on machine B (its dense bf16
# call found the session's device time spent):
samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/srv --variants samoyeds-fp8 --stages serving \
  --concurrency 1 --prompts-per-client 16
samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/srv --variants dense --stages serving \
  --concurrency 1 --prompts-per-client 16
# 2026-11-28, one H200 (143771 MiB, driver 580.159.04), the tree of dab1c70 (order_key takes -0 as +0, the routing
# test's "signed zeros" case added): tests-signed-zeros.log
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "routes_its_logits"
