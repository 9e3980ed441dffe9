# As run on one nvidia-h100-x1 machine (H100 80GB HBM3, driver 580.159.04), 2026-12-07 11:43-12:02, main at be062d5
# (harness 5: three timed rounds per served level, the median stands). After the device bundle's unpack, three calls
# on the same machine, one after the other, each `bash .ab/e2e.sh VARIANT STAGES ...`: `source .ab/setup.sh`
# (vLLM's env, `pip install -e .`), then
#   timeout 560 samoyeds-vllm bench e2e --out /tmp/e2e --variants VARIANT --stages STAGES ...
# into one folder kept on the machine between the calls (the run resumes there), and kill any server left over.
bash .ab/e2e.sh dense-fp8 serving,capacity --concurrency 1,16,64,256      # 11:43-11:51
bash .ab/e2e.sh samoyeds-fp8 serving,capacity --concurrency 1,16,64,256   # 11:51-11:56
bash .ab/e2e.sh samoyeds-fp8,dense-fp8 offline --quick                    # 11:56-11:59
# Only a few files of each call came back (the transfer's limit on the number of files): results.json of the second
# call (both variants' served levels, memory and capacity) and the offline runs' jsonl of the third. The variant
# files here are that results.json's variants with the offline rows of the jsonl added (their engine records; for
# samoyeds-fp8 without its offline log, which did not come back), and results.md / results.json / the plots were
# written from them here with `samoyeds-vllm bench e2e --report --out benchmarks/results/e2e-h5-h100`.

# The long mixes, the same day 15:41-15:55 on another nvidia-h100-x1 machine (H100 80GB HBM3, driver 580.159.04), main
# at 2c1372f (the kernels of be062d5 unchanged), after the bundle's unpack; the session's device time allowed these:
bash .ab/e2e.sh dense-fp8 offline --mixes 1024:256,4096:64 --batch-sizes 16,64,256   # cut by its timeout before 4096:64 at 256
bash .ab/e2e.sh samoyeds-fp8 offline --mixes 1024:256 --batch-sizes 16,64,256
bash .ab/e2e.sh samoyeds-fp8 offline --mixes 4096:64 --batch-sizes 16,64
# (this time each call tarred its whole output folder into one file, so every log came back: logs/*-1024x256.*,
# logs/*-4096x64.*). Their throughput rows and offline engine records were added to the two variant files here (the
# new files' device and settings checked equal to these), then `bench e2e --report` run again as above.
