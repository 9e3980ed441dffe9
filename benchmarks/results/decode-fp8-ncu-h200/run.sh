# One NVIDIA H200 (143771 MiB, driver 580.159.04), 2026-11-28, main at 1891f72 (the kernels; the -0 routing change
# beside them touches only the one-token kernels), one forward of the layer at T = 16 under Nsight Compute:
for shape in mixtral-8x7b qwen3-235b-a22b; do for values in fp8 bf16; do
  ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
    python3 benchmarks/ncu_moe.py --shape $shape --pattern samoyeds --tokens 16 --values $values \
    > ncu-$shape-16-$values.txt
done; done
