"""benchmarks/copy_bandwidth.cu compiles for sm_90a with every kernel the benchmark asks for (the GPU test runs them:
tests/gpu/test_copy_bandwidth_runs.py)."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "benchmarks" / "copy_bandwidth.py"
spec = importlib.util.spec_from_file_location("copy_bandwidth", SCRIPT)
copy_bandwidth = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copy_bandwidth)


def test_every_timed_kernel_compiles_for_hopper(tmp_path):
    if not shutil.which("nvcc"):
        pytest.skip("needs nvcc")
    signature = "(const uint4*, long long, unsigned long long*)"
    lines = ['#include "copy_bandwidth.cu"']
    lines += [f"template __global__ void {kernel}{signature};" for _, kernel, _, _ in copy_bandwidth.configs()]
    (tmp_path / "all.cu").write_text("\n".join(lines) + "\n")
    command = ["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-std=c++17", "-I", str(REPO / "csrc")]
    command += ["-I", str(SCRIPT.parent), "-c", str(tmp_path / "all.cu"), "-o", str(tmp_path / "all.o")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(copy_bandwidth.configs()) == 1 + len(copy_bandwidth.STAGE_SHAPES) * (1 + len(copy_bandwidth.CHUNKS))
