[ -f /tmp/vllm-env.sh ] || { echo NO ENV; exit 3; }
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 - <<'PY'
p='samoyeds_vllm/kernels/plan.py'; s=open(p).read()
old='        return [BlockShape("mma", 4, 2 if gate_up else 1)]\n'
assert old in s
s=s.replace(old,'        return [BlockShape("mma", 4, 2 if gate_up else 1)] + ([BlockShape("mma", 8, 2)] if gate_up else [BlockShape("mma", 8, 1), BlockShape("mma", 4, 2)])\n')
open(p,'w').write(s)
PY
CFG='{"default": {}, "gu8": {"gate_up": {"kind":"mma","warps":8,"slabs":2}}, "dn4x2": {"down": {"kind":"mma","warps":4,"slabs":2}}, "both": {"gate_up": {"kind":"mma","warps":8,"slabs":2}, "down": {"kind":"mma","warps":4,"slabs":2}}}'
timeout 250 python3 probe_time.py --shapes qwen3-30b-a3b --tokens 16,32,48,64,96,128 --configs "$CFG" --tag q --json $OUT/exp.jsonl 2>&1 | grep -v Warn
timeout 150 python3 probe_time.py --shapes mixtral-8x7b --tokens 8,16,32,48 --configs "$CFG" --tag m --json $OUT/exp.jsonl 2>&1 | grep -v Warn
timeout 180 python3 probe_time.py --shapes qwen3-235b-a22b --tokens 16,64,128 --configs "$CFG" --tag b --json $OUT/exp.jsonl 2>&1 | grep -v Warn
[ -f /tmp/vllm-env.sh ] || { echo NO ENV; exit 3; }
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
CFG='{"rule": {}, "old": {"gate_up": {"kind":"mma","warps":4,"slabs":2}, "down": {"kind":"mma","warps":4,"slabs":1}}}'
timeout 200 python3 probe_time.py --shapes qwen3-30b-a3b --tokens 1,4,16,32,48,64,96,128 --configs "$CFG" --tag q --json $OUT/rule.jsonl 2>&1 | grep -v Warn
timeout 120 python3 probe_time.py --shapes mixtral-8x7b --tokens 1,8,16,48 --configs "$CFG" --tag m --json $OUT/rule.jsonl 2>&1 | grep -v Warn
timeout 120 python3 probe_time.py --shapes qwen3-235b-a22b --tokens 1,16,64,128 --configs "$CFG" --tag b --json $OUT/rule.jsonl 2>&1 | grep -v Warn
timeout 100 python3 probe_time.py --shapes qwen3-30b-a3b --values bf16 --tokens 1,16,64 --configs "$CFG" --tag q16 --json $OUT/rule.jsonl 2>&1 | grep -v Warn
# stages*-splits.json: csrc/config.cuh's STAGES set to 3, 4, 5 by sed, then
#   python3 benchmarks/tune_kernels.py --shapes qwen3-30b-a3b --patterns samoyeds --tokens 16,64 --search splits --values fp8
# ncu-*.txt: ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
#   --section Occupancy --section LaunchStats --section WarpStateStats python3 benchmarks/ncu_moe.py --values fp8 --tokens T
