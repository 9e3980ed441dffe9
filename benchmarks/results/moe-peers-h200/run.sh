# Two NVIDIA H200s of one host (143771 MiB, driver 580.159.04), 2026-11-28, main at 1891f72, vLLM 0.26.0, torch
# 2.11.0+cu130; each GPU ran its queue of (shape, pattern) one after the other (peers-gpu0.log, peers-gpu1.log);
# GPU 1 served a model (../serving-h200-2026-11-28/) between its shapes, not while one ran.
for job in "deepseek-v3 samoyeds" "qwen3-30b-a3b samoyeds" "qwen3-30b-a3b 2:4" "deepseek-v3 2:4" \
           "mixtral-8x7b 2:4" "qwen3-235b-a22b samoyeds" "mixtral-8x7b samoyeds" "qwen3-235b-a22b 2:4"; do
  set -- $job
  samoyeds-vllm bench moe --shape $1 --pattern $2 --values fp8 --tokens 1,16,64,256,1024,4096,16384 \
    --peers bf16-triton,fp8-triton,fp8-deepgemm,w4a16-marlin --json peers-$1-${2/:/of}.json
done
python benchmarks/plot_moe.py samoyeds-vs-peers.png peers-*-samoyeds.json
python benchmarks/plot_moe.py 2of4-vs-peers.png peers-*-2of4.json
