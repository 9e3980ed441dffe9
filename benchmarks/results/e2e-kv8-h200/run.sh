# As run on one nvidia-h200-x2 machine (two H200s of one host, 143771 MiB, driver 580.159.04), 2026-11-28
# 22:11-22:19, main at 4e16755 (harness 4), vLLM 0.26.0, torch 2.11.0+cu130: the long mixes of harness 4 again, with
# the KV cache in FP8 on both sides (vLLM's --kv-cache-dtype fp8: what long-context users run, and half the bytes
# attention reads). One device call after the bundle's unpack and a call of kernel work on GPU 0 (its ncu and tests
# had ended); off.sh is ../e2e-mixes-h200/off.sh (one `bench e2e` on one GPU into /tmp/DIR, packed afterwards).
# Afterwards: python merge.py && samoyeds-vllm bench e2e --report --out merged
source .ab/setup.sh
(GPU=0 VARIANTS=samoyeds-fp8 DIR=kv8s TL=565 bash .ab/off.sh --stages offline --mixes 1024:256,4096:64 \
  --batch-sizes 16,64,256 --engine-args "--kv-cache-dtype fp8") &
(GPU=1 VARIANTS=dense-fp8 DIR=kv8d8 TL=565 bash .ab/off.sh --stages offline --mixes 1024:256,4096:64 \
  --batch-sizes 16,64,256 --engine-args "--kv-cache-dtype fp8") &
wait
