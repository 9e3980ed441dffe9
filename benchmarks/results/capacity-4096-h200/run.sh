# As run on one nvidia-h200-x2 machine (GPU 1 of two H200s, 143771 MiB, driver 580.159.04), 2026-11-28 22:01-22:10,
# main at 4e16755 (harness 4), vLLM 0.26.0, torch 2.11.0+cu130, in the call after the bundle's unpack, while GPU 0
# ran ncu and kernel tests (../ws-gemm-t256-ncu-h200/, ../slot-sum-pairs-h200/). off.sh is ../e2e-mixes-h200/off.sh.
# The call's limit (540 s) stopped it during the sixth probe (380 sequences): the probes then ran at every one of
# the six loads, from 0.5x the estimate upwards; bench e2e now runs them from the estimate outwards (two here).
source .ab/setup.sh
GPU=1 VARIANTS=samoyeds-fp8 DIR=capS TL=540 bash .ab/off.sh --stages capacity
