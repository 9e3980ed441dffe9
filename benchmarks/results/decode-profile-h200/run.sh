# One H200 (143771 MiB, driver 580.159.04), 2026-11-27, main at 382ae82 (profile_decode.py splitting overlapping
# kernels' time to the earliest-started one), vLLM 0.26.0, torch 2.11.0+cu130; after the unpack calls:
python3 benchmarks/profile_decode.py --preset qwen3-30b-a3b --batch 1,16 --out /tmp/prof \
  --variants dense,dense-fp8,samoyeds,samoyeds-fp8
# (the call's .ab/prof.sh; logs.tgz holds each variant's log)
python3 benchmarks/profile_decode.py --out benchmarks/results/decode-profile-h200 --replot   # profile-decode.png (CPU, later)
