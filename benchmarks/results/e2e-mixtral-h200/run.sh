# As run on one nvidia-h200-x2 machine (two H200s of one host), 2026-11-28 15:46-15:53, main at b85e762, after the
# calls of ../e2e-mixes-h200/run.sh; off.sh is ../e2e-mixes-h200/off.sh (one `bench e2e` on one GPU into /tmp/DIR).
# Each variant comes from one run; merged/ holds their variant JSONs and `samoyeds-vllm bench e2e --report --out
# merged` wrote the comparison.

# call 1: samoyeds FP8 and dense FP8 side by side (the samoyeds engine's points carry other_gpus_in_use: the dense
# FP8 engine held GPU 1 then; the dense FP8 engine's timed points came after the samoyeds run had ended)
(MODEL=mixtral-8x7b GPU=0 VARIANTS=samoyeds-fp8 DIR=mixq0 TL=470 bash .ab/off.sh --quick) &
(MODEL=mixtral-8x7b GPU=1 VARIANTS=dense-fp8 DIR=mixq1 TL=470 bash .ab/off.sh --quick) &
wait
# call 2: dense bf16 alone on the host
MODEL=mixtral-8x7b GPU=0 VARIANTS=dense DIR=mixq2 TL=265 bash .ab/off.sh --quick
