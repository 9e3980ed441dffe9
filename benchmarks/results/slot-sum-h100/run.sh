#!/bin/bash
# A/B of the slot sum and split-K SiLU change: main before (2608b25: `git archive` of samoyeds_vllm, csrc and configs
# with csrc/ and configs/ moved into the package, as .ab/old.tar, untracked) and after, `bench moe --no-vllm`
# (bf16 and FP8 values), alternating trees, two rounds, on one GPU. Writes ab.log, summary.txt and the JSONs as
# ab-json.tgz under $OUT.
set -u
source /tmp/vllm-env.sh
R=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
mkdir -p /tmp/old /tmp/ab && tar -xf .ab/old.tar -C /tmp/old
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
cd /tmp
PYTHONPATH=/tmp/old:${PYTHONPATH:-} python3 -c "import samoyeds_vllm.kernels as k; print('old tree:', k.__file__)" | tee -a $OUT/ab.log
run() {  # tree tag shape pattern tokens round
  local pp=""; [ "$1" = old ] && pp=/tmp/old
  PYTHONPATH=$pp${PYTHONPATH:+:$PYTHONPATH} samoyeds-vllm bench moe --no-vllm --shape $3 --pattern $4 --values fp8 \
    --tokens $5 --json /tmp/ab/$1-$2-r$6.json 2>&1 | grep -v "Warning\|bench moe" >> $OUT/ab.log
}
for r in 1 2; do
  for tree in old new; do
    run $tree qwen3-samoyeds qwen3-30b-a3b samoyeds 1,256,512 $r
    run $tree mixtral-samoyeds mixtral-8x7b samoyeds 1,64,256 $r

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
print("shape-pattern values T: old µs (rounds) | new µs (rounds) | old best / new best")
for (tag, name, t, tree) in sorted(k for k in us if k[3] == "old"):
    o, n = us[(tag, name, t, "old")], us[(tag, name, t, "new")]
    print(f"{tag} {name} {t}: {' '.join(f'{v:.1f}' for v in o)} | {' '.join(f'{v:.1f}' for v in n)} | {min(o) / min(n):.3f}")
PY
cat $OUT/summary.txt
