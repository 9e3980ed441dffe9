# NVIDIA H200 (143771 MiB, driver 580.159.04), 2026-11-28, vLLM 0.26.0, torch 2.11.0+cu130. samoyeds.json came
# from one H200 with the change before the 16-token default (every cell's "default" was then bf16 activations in
# the decode tiles); 2of4.json and mixtral-samoyeds-on-table.json likewise, on another call; tile16-*, tables-* and
# peers/ came from two H200s of one host with the rule and tables of this commit (peers on one GPU at a time each,
# the searches on GPU 1, logs in peers/peers-gpu*.log).
python benchmarks/tune_kernels.py --shapes qwen3-30b-a3b,mixtral-8x7b,qwen3-235b-a22b --patterns samoyeds \
  --tokens 4,8,16,32,64,128,256 --search activations --values fp8 --json samoyeds.json
python benchmarks/tune_kernels.py --shapes qwen3-30b-a3b,mixtral-8x7b,qwen3-235b-a22b --patterns 2:4 \
  --tokens 4,8,16,32,64,128,256 --search activations --values fp8 --json 2of4.json
python benchmarks/tune_kernels.py --shapes mixtral-8x7b --patterns samoyeds --tokens 4,8,16,24 \
  --search activations --values fp8 --json mixtral-samoyeds-on-table.json
for p in samoyeds 2:4; do
  python benchmarks/tune_kernels.py --shapes olmoe-1b-7b,deepseek-v2-lite,qwen1.5-moe-a2.7b --patterns $p \
    --tokens 64,128 --search activations --values fp8 --json tile16-other-shapes-${p/:/of}.json
done
python benchmarks/tune_kernels.py --shapes qwen3-30b-a3b --patterns samoyeds --tokens 16 --search activations \
  --values fp8 --json tables-qwen3-samoyeds.json   # likewise qwen3 2:4 T = 64, qwen3-235b 2:4 T = 4,
                                                   # deepseek-v2-lite samoyeds T = 64,128
for job in "mixtral-8x7b samoyeds" "qwen3-235b-a22b 2:4" "qwen3-30b-a3b samoyeds" \
           "qwen3-235b-a22b samoyeds" "mixtral-8x7b 2:4" "qwen3-30b-a3b 2:4"; do
  set -- $job
  samoyeds-vllm bench moe --shape $1 --pattern $2 --values fp8 --tokens 16,64,256 \
    --peers bf16-triton,fp8-triton,fp8-deepgemm,w4a16-marlin --json peers/peers-$1-${2/:/of}.json
done
pytest -q tests/gpu/test_kernels.py -k few_tokens > tests-few-tokens.log
pytest -q tests/gpu/test_kernels.py -k "test_fp8_values and 64" > tests-fp8-values-64.log
# Nsight Compute, one H200, the kernels of this commit, Mixtral T = 16 with both GEMMs FP8 x FP8 on its table's
# splits (a table in act8/: {"16": {"gate_up": {"splits": 2, "fp8_activations": true}, "down": {"splits": 3,
# "fp8_activations": true}}}); the bf16-activation side is ../decode-fp8-ncu-h200/ncu-mixtral-8x7b-16-fp8.txt.
SAMOYEDS_KERNEL_CONFIG_DIR=act8 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
  --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
  --section SchedulerStats python3 benchmarks/ncu_moe.py --shape mixtral-8x7b --pattern samoyeds --tokens 16 \
  --values fp8 > ncu-mixtral-8x7b-16-fp8-act8.txt
# the JIT cost, on the CPU machine (no GPU): NVRTC 13.0 through libnvrtc
python nvrtc_compile_time.py samoyeds,2:4 > nvrtc-compile-time.log
