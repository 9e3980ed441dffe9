#!/bin/bash
set -u
source /tmp/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "one_token or graph or (every_shape and -1-) or (test_fp8_values and -1-) or split_k" 2>&1 | tail -15 | tee $OUT/tests.log
