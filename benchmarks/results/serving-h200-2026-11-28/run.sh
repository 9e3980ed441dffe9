# Two NVIDIA H200s of one host (143771 MiB, driver 580.159.04), 2026-11-28, vLLM 0.26.0, torch 2.11.0+cu130, main at
# 1891f72, Qwen3-30B-A3B shape, dummy weights, 4 API servers, prefix caching off (bench e2e's serving stage).
# 256 clients (c256/), on GPU 1, one variant after the other, 4 requests per client after an untimed round; dense
# FP8's first call ran out of its time in its untimed rounds (they kept compiling), and the second call resumed it
# on the same machine: two more untimed rounds, the second compiling nothing, then the timed one, compiling nothing
# (results.json: warmup_runs, warmup_jit_free, jit_free):
samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/srv1 --variants dense-fp8 --stages serving \
  --concurrency 256 --prompts-per-client 4
samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/srv1 --variants samoyeds-fp8 --stages serving \
  --concurrency 256 --prompts-per-client 4
# One client (c1/), 16 timed requests after an untimed round of 16, at the same time: dense FP8 on GPU 0, samoyeds
# FP8 on GPU 1 (its report step refused to mix its 16-request level with the 4-request level of c256 in the same
# folder; the level's JSON was written before that):
CUDA_VISIBLE_DEVICES=0 samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/srv0 --variants dense-fp8 \
  --stages serving --concurrency 1 --prompts-per-client 16
CUDA_VISIBLE_DEVICES=1 samoyeds-vllm bench e2e --model qwen3-30b-a3b --out /tmp/srv1 --variants samoyeds-fp8 \
  --stages serving --concurrency 1 --prompts-per-client 16
