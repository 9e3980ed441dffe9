#!/bin/bash
# A/B of programmatic dependent launch: main before (8a96400: `git archive` of samoyeds_vllm, csrc and configs with
# csrc/ and configs/ moved into the package, as .ab/old.tar, untracked), the new tree launched in plain stream order
# (SAMOYEDS_DEPENDENT_LAUNCH=0) and the new tree as shipped; `bench moe --no-vllm --values fp8` (bf16 and FP8
# values, CUDA graphs), alternating, two rounds, one GPU. Writes ab.log, summary.txt and the JSONs (ab-json.tgz).
set -u
source /tmp/vllm-env.sh
R=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
mkdir -p /tmp/old /tmp/ab && tar -xf .ab/old.tar -C /tmp/old
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
cd /tmp
PYTHONPATH=/tmp/old:${PYTHONPATH:-} python3 -c "import samoyeds_vllm.kernels as k; print('old tree:', k.__file__)" | tee -a $OUT/ab.log
run() {  # tree tag shape pattern tokens round
  local pp="" serial=1; [ "$1" = old ] && pp=/tmp/old; [ "$1" = serial ] && serial=0
  SAMOYEDS_DEPENDENT_LAUNCH=$serial PYTHONPATH=$pp${PYTHONPATH:+:$PYTHONPATH} samoyeds-vllm bench moe --no-vllm \
    --shape $3 --pattern $4 --values fp8 --tokens $5 --json /tmp/ab/$1-$2-r$6.json 2>&1 \
    | grep -v "Warning\|bench moe" >> $OUT/ab.log
}
for r in ${ROUNDS:-1 2}; do
  for tree in old serial new; do
    run $tree qwen3-samoyeds qwen3-30b-a3b samoyeds ${QWEN_TOKENS:-1,16,64,256,1024} $r
    run $tree mixtral-samoyeds mixtral-8x7b samoyeds ${MIXTRAL_TOKENS:-1,64,256} $r
  done
done
tar -czf $OUT/ab-json.tgz -C /tmp/ab .
python3 - > $OUT/summary.txt <<'PY'
import glob, json, os, collections
us = collections.defaultdict(list)
for f in sorted(glob.glob("/tmp/ab/*.json")):
    tree, tag = os.path.basename(f).split("-", 1)
    tag = tag.rsplit("-r", 1)[0]
    for row in json.load(open(f))["rows"]:
        for path in row["paths"]:
            us[(tag, path["name"], row["tokens"], tree)].append(path["us"])
print("shape-pattern values T: old µs (rounds) | serial | new | old best / new best, serial best / new best")
for (tag, name, t, tree) in sorted(k for k in us if k[3] == "old"):
    o, s, n = (us[(tag, name, t, x)] for x in ("old", "serial", "new"))
    f = lambda v: " ".join(f"{x:.1f}" for x in v)
    print(f"{tag} {name} {t}: {f(o)} | {f(s)} | {f(n)} | {min(o) / min(n):.3f}, {min(s) / min(n):.3f}")
PY
cat $OUT/summary.txt
