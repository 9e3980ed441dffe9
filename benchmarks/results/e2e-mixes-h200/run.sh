# As run on one nvidia-h200-x2 machine (two H200s of one host), 2026-11-28, main at b3b1a41 plus the uncommitted
# profile_decode --prompt-len of 7ebb3e8 (bench e2e's code as at b3b1a41). Three device calls, each starting with
# `source .ab/setup.sh` (vLLM's env, `pip install -e .`); off.sh (beside this file) runs one `bench e2e` on one GPU
# into /tmp/DIR and packs it. Each call's two subshells ran at the same time, one per GPU.
# Afterwards: python merge.py && samoyeds-vllm bench e2e --report --out merged

# call 1 (12:30-12:39): both cut at 520 s by `timeout`: samoyeds FP8 during 4096:64 at 1024 sequences, dense FP8
# before its 4096:64 engine had timed a batch (call 2 ran that mix again, to 256 sequences)
(GPU=0 VARIANTS=samoyeds-fp8 DIR=mixes TL=${TL:-520} bash .ab/off.sh --stages offline --mixes 1024:256,4096:64 --batch-sizes 1,16,64,256,1024) &
(GPU=1 VARIANTS=dense-fp8 DIR=mixes1 TL=${TL:-520} bash .ab/off.sh --stages offline --mixes 1024:256,4096:64 --batch-sizes 1,16,64,256,1024) &
wait; cat /tmp/mixes/results.md /tmp/mixes1/results.md 2>/dev/null | grep -v "^$" | head -60

# call 2 (12:42-12:48)
(export CUDA_VISIBLE_DEVICES=0; timeout ${TL:-470} python3 benchmarks/profile_decode.py --preset qwen3-30b-a3b --batch 256 --prompt-len 1024 --steps 16 --variants samoyeds-fp8,dense-fp8 --out /tmp/prof > $OUT/prof.log 2>&1; echo "prof rc=$?" | tee -a $OUT/prof.log; (cd /tmp && tar czf $OUT/prof.tgz --exclude='trace-*' --exclude='*.safetensors' prof)) &
(GPU=1 VARIANTS=dense-fp8 DIR=mixes1b TL=${TL:-470} bash .ab/off.sh --stages offline --mixes 4096:64 --batch-sizes 1,16,64,256) &

# call 3 (12:50-12:56)
(GPU=0 VARIANTS=samoyeds-fp8 DIR=mixes2 TL=240 bash .ab/off.sh --stages offline --mixes 1024:256 --batch-sizes 64,256,1024; GPU=0 VARIANTS=samoyeds-fp8 DIR=quick0 TL=$(( 530-SECONDS > 30 ? 530-SECONDS : 1 )) bash .ab/off.sh --quick) &
(GPU=1 VARIANTS=dense DIR=quick1 TL=260 bash .ab/off.sh --quick; GPU=1 VARIANTS=dense DIR=mixes3 TL=$(( 530-SECONDS > 30 ? 530-SECONDS : 1 )) bash .ab/off.sh --stages offline --mixes 1024:256 --batch-sizes 1,16,64,256,1024) &

# Later the same day (15:26-15:46), main at b85e762: three calls; profc/'s decode steps were read afterwards (--reread)
# call 4 (15:26-15:35): GPU0 profiled decodes at 1024-token cached prompts, samoyeds FP8 and dense bf16, into profd/;
# GPU1 dense FP8 1024:256 again (mixes4/: no other engine on the host during its timed batches, by the flag)
(export CUDA_VISIBLE_DEVICES=0; timeout 520 python3 benchmarks/profile_decode.py --preset qwen3-30b-a3b --batch 256 --prompt-len 1024 --cached-prompts --steps 32 --variants samoyeds-fp8,dense --out /tmp/profd) &
(GPU=1 VARIANTS=dense-fp8 DIR=mixes4 TL=520 bash .ab/off.sh --stages offline --mixes 1024:256 --batch-sizes 256,1024) &
# call 5 (15:35-15:37): GPU0 the same profile of dense FP8 (profd8/); GPU1 dense bf16 4096:64 (mixes5/)
(export CUDA_VISIBLE_DEVICES=0; timeout 520 python3 benchmarks/profile_decode.py --preset qwen3-30b-a3b --batch 256 --prompt-len 1024 --cached-prompts --steps 32 --variants dense-fp8 --out /tmp/profd8) &
(GPU=1 VARIANTS=dense DIR=mixes5 TL=520 bash .ab/off.sh --stages offline --mixes 4096:64 --batch-sizes 1,16,64,256) &
# call 6 (15:40-15:46, a machine started afresh, maybe another host): samoyeds FP8 and dense FP8 profiled again with GPU1 idle, traces kept
# (profc/); its decode steps were read from those traces here: profile_decode.py --out profc --reread
CUDA_VISIBLE_DEVICES=0 timeout 440 python3 benchmarks/profile_decode.py --preset qwen3-30b-a3b --batch 256 --prompt-len 1024 --cached-prompts --steps 32 --variants samoyeds-fp8,dense-fp8 --out /tmp/profc
