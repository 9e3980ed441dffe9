#!/bin/bash
# quantize_rows with chunks in flight (.ab/quant.tar, branch next/quantize-loads-in-flight) against main:
# GPU fp8 tests of the branch tree, then bench moe --values fp8 alternating, two rounds.
# As run, the import check and the pytest below ran from the repository root, so they imported main's tree (the
# current directory comes before PYTHONPATH): ab.log's first line names main's file and their 56 passes are main's.
# The benchmarks ran from /tmp, where /tmp/quant came first (main's Mixtral FP8 numbers match the day's earlier
# runs, the branch's differ). The branch's own GPU tests ran in a second call, tests.log.
set -u
source /tmp/vllm-env.sh
mkdir -p /tmp/quant /tmp/ab && tar -xf .ab/quant.tar -C /tmp/quant
PYTHONPATH=/tmp/quant:$PYTHONPATH python3 -c "import samoyeds_vllm.kernels as k; print('branch tree:', k.__file__)" | tee $OUT/ab.log
PYTHONPATH=/tmp/quant:$PYTHONPATH timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "fp8_values or fp8_act" -x 2>&1 | tail -8 | tee $OUT/quant-tests.log
cd /tmp
run() {  # tree tag shape tokens round
  local pp=""; [ "$1" = quant ] && pp=/tmp/quant:
  PYTHONPATH=$pp$PYTHONPATH samoyeds-vllm bench moe --no-vllm --shape $3 --pattern samoyeds --values fp8 --tokens $4 \
    --json /tmp/ab/$1-$2-r$5.json 2>&1 | grep -v "Warning\|bench moe" >> $OUT/ab.log
}
for r in 1 2; do for tree in main quant; do
  run $tree qwen3 qwen3-30b-a3b 64,256,1024,4096 $r
  run $tree mixtral mixtral-8x7b 64,256,1024 $r
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
print("shape values T: main us (rounds) | branch | main best / branch best | errors main, branch")
for (tag, name, t, tree) in sorted(k for k in us if k[3] == "main"):
    m, q = us[(tag, name, t, "main")], us[(tag, name, t, "quant")]
    f = lambda v: " ".join(f"{x[0]:.1f}" for x in v)
    print(f"{tag} {name} {t}: {f(m)} | {f(q)} | {min(x[0] for x in m) / min(x[0] for x in q):.3f} | {m[0][1]}, {q[0][1]}")
PY
cat $OUT/summary.txt
