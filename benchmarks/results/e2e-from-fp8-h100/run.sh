# As run on one nvidia-h100-x1 machine (H100 80GB HBM3, driver 580.159.04), 2026-12-07 22:11-22:35, main at e2229b7
# with the samoyeds-fp8-from-fp8 variant of bench e2e added (committed after it as the next commit), harness 5.
# After the device bundle's unpack, five calls on the same machine, one after the other, each
# `bash .ab/e2e.sh VARIANTS offline ...`: `source .ab/setup.sh` (vLLM's env, `pip install -e .`), then
#   timeout T samoyeds-vllm bench e2e --out /tmp/e2e --variants VARIANTS --stages offline ...
# into one folder kept on the machine between the calls (the run resumes there), every file of it tarred back.
bash .ab/e2e.sh samoyeds-fp8-from-fp8,samoyeds-fp8 offline --mixes 4096:64 --batch-sizes 16,64    # 22:11-22:18
bash .ab/e2e.sh dense-fp8 offline --mixes 4096:64 --batch-sizes 16,64                             # 22:19-22:21
bash .ab/e2e.sh samoyeds-fp8-from-fp8,samoyeds-fp8 offline --mixes 1024:256 --batch-sizes 256    # 22:22-22:26
bash .ab/e2e.sh dense-fp8 offline --mixes 1024:256 --batch-sizes 256                              # 22:26-22:28
bash .ab/e2e.sh samoyeds-fp8-from-fp8,samoyeds-fp8 offline --mixes 128:128 --batch-sizes 16,256  # 22:29-22:32
# results.md / results.json / the plots: the last call's, written again here with
#   samoyeds-vllm bench e2e --report --out benchmarks/results/e2e-from-fp8-h100
# logs/: the engines' logs and records as the last call tarred them.
