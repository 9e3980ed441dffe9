#!/bin/bash
# GEMM 1 of one token reading its tile map from topk_ids (working tree) against main before it (.ab/old.tar):
# bench moe --no-vllm --values fp8 (bf16 and FP8 values, CUDA graphs), alternating, two rounds.
set -u
source /tmp/vllm-env.sh
mkdir -p /tmp/old /tmp/ab && tar -xf .ab/old.tar -C /tmp/old
cd /tmp
PYTHONPATH=/tmp/old:$PYTHONPATH python3 -c "import samoyeds_vllm.kernels as k; print('old tree:', k.__file__)" | tee $OUT/ab.log
python3 -c "import samoyeds_vllm.kernels as k; print('new tree:', k.__file__)" | tee -a $OUT/ab.log
run() {  # tree tag shape tokens round
  local pp=""; [ "$1" = old ] && pp=/tmp/old:
  PYTHONPATH=$pp$PYTHONPATH samoyeds-vllm bench moe --no-vllm --shape $3 --pattern samoyeds --values fp8 --tokens $4 \
    --json /tmp/ab/$1-$2-r$5.json 2>&1 | grep -v "Warning\|bench moe" >> $OUT/ab.log
}
for r in 1 2; do for tree in old new; do
  run $tree qwen3 qwen3-30b-a3b 1,16 $r
  run $tree mixtral mixtral-8x7b 1 $r
done; done
tar -czf $OUT/ab-json.tgz -C /tmp/ab .
python3 - > $OUT/summary.txt <<'PY'
import glob, json, os, collections
us = collections.defaultdict(list)
for f in sorted(glob.glob("/tmp/ab/*.json")):
    tree, tag = os.path.basename(f).split("-", 1)
    tag = tag.rsplit("-r", 1)[0]
    for row in json.load(open(f))["rows"]:
        for path in row["paths"]:
            us[(tag, path["name"], row["tokens"], tree)].append((path["us"], path.get("rel_err_own")))
print("shape values T: old us (rounds) | new | old best / new best | errors old, new")
for (tag, name, t, tree) in sorted(k for k in us if k[3] == "old"):
    o, n = us[(tag, name, t, "old")], us[(tag, name, t, "new")]
    f = lambda v: " ".join(f"{x[0]:.1f}" for x in v)
    print(f"{tag} {name} {t}: {f(o)} | {f(n)} | {min(x[0] for x in o) / min(x[0] for x in n):.3f} | {o[0][1]}, {n[0][1]}")
PY
cat $OUT/summary.txt
