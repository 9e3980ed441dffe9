#!/bin/bash
# Layer host time before (61020f0, ab_old.tgz) and after the host-time change, on one GPU; GPU tests of the new
# launch path first (untracked helper). STEP=tests|host
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p /tmp/old && tar xzf ab_old.tgz -C /tmp/old
if [ "$STEP" = tests ]; then
  timeout ${BUDGET:-500} python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_kernels.py \
    -k "every_shape or routings or fp8_values or fresh or refused or zero_rows or before_hopper or split_k or either_gemm" 2>&1 | tail -15
fi
if [ "$STEP" = host ]; then
  T=${TOKENS:-1,16,256,640,1024,4096}
  python3 benchmarks/host_overhead.py --tokens $T --json $OUT/host-new.json --profile $OUT/profile-new.txt 2>&1 | grep -v Warning | tail -14
  PYTHONPATH=/tmp/old:$PYTHONPATH python3 -c "import samoyeds_vllm.kernels.launch as l; print('old tree:', l.__file__)"
  (cd /tmp && PYTHONPATH=/tmp/old:$PYTHONPATH python3 $OLDPWD/benchmarks/host_overhead.py --tokens $T --json $OUT/host-old.json --profile $OUT/profile-old.txt 2>&1 | grep -v Warning | tail -14)
  python3 benchmarks/host_overhead.py --tokens $T --json $OUT/host-new-2.json 2>&1 | grep -v Warning | tail -14
fi
