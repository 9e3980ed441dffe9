# As run on one nvidia-h200-x2 machine (two H200s of one host, driver 580.159.04), 2026-11-28 18:48-19:16, main at
# 0491d18 (harness 4: make-model's tokenizer knows every id). Four device calls after the bundle's unpack, each
# starting with `source .ab/setup.sh` (vLLM's env, `pip install -e .`); off.sh (../e2e-mixes-h200/off.sh) runs one `bench e2e`
# on one GPU into /tmp/DIR (resuming what DIR holds) and packs it. Subshells of one call ran at the same time, one
# per GPU. Afterwards: python merge.py && samoyeds-vllm bench e2e --report --out merged

# call 1 (18:48-18:55): the long mixes, samoyeds FP8 beside dense FP8
(GPU=0 VARIANTS=samoyeds-fp8 DIR=h4s TL=520 bash .ab/off.sh --stages offline --mixes 1024:256,4096:64 --batch-sizes 16,64,256) &
(GPU=1 VARIANTS=dense-fp8 DIR=h4d8 TL=520 bash .ab/off.sh --stages offline --mixes 1024:256,4096:64 --batch-sizes 16,64,256) &
wait

# call 2 (18:55-19:00): dense bf16's long mixes beside 128:128 of samoyeds FP8, then of dense FP8 (same folders as call 1)
(GPU=0 VARIANTS=dense DIR=h4d TL=520 bash .ab/off.sh --stages offline --mixes 1024:256,4096:64 --batch-sizes 16,64,256) &
(GPU=1 VARIANTS=samoyeds-fp8 DIR=h4s TL=200 bash .ab/off.sh --stages offline --mixes 128:128 --batch-sizes 16,64,256,1024
 GPU=1 VARIANTS=dense-fp8 DIR=h4d8 TL=$(( 540 - SECONDS )) bash .ab/off.sh --stages offline --mixes 128:128 --batch-sizes 16,64,256,1024) &
wait

# call 3 (19:00-19:07), GPU1 idle: the whole 1024:256 generate at 256 sequences profiled (prompts not cached); then
# dense FP8 128:128 at 16 / 64 again (h4d8's 16-sequence point had compiled in all three timed runs)
CUDA_VISIBLE_DEVICES=0 timeout 330 python3 benchmarks/profile_decode.py --preset qwen3-30b-a3b --batch 256 --prompt-len 1024 --steps 256 --variants samoyeds-fp8,dense-fp8 --out /tmp/profw
GPU=0 VARIANTS=dense-fp8 DIR=h4d8b TL=200 bash .ab/off.sh --stages offline --mixes 128:128 --batch-sizes 16,64

# call 4 (19:07-19:16): served, 128/128 at 16 / 64 / 256 clients (four API servers), side by side
(GPU=0 VARIANTS=samoyeds-fp8 DIR=h4vs TL=520 bash .ab/off.sh --stages serving --concurrency 16,64,256) &
(GPU=1 VARIANTS=dense-fp8 DIR=h4vd8 TL=520 bash .ab/off.sh --stages serving --concurrency 16,64,256) &
wait
