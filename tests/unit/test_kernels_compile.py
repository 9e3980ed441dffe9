"""Every kernel a launch plan can name compiles with nvcc as NVRTC compiles it on the GPU, checked on CPU before a GPU
runs it, and keeps its registers: ptxas' report (-Xptxas -v) of each kernel. Hopper's kernels (sm_90a, the measured
ones) spill nothing; the pre-Hopper build (sm_80: Ampere and Ada; run on Hopper by the GPU tests, never timed) spills
in three of its 64-token samoyeds tiles at 255 registers, 20-64 bytes with bf16 values and 80-108 with FP8 values, so
its bound is 128 bytes: past it a change has made the spilling worse. bf16 activations: fp16 instantiates the same
templates with another element type."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.kernels.build import MAIN_SOURCE
from samoyeds_vllm.kernels.plan import compiled_kernels

CSRC = Path(__file__).resolve().parents[2] / "csrc"
#: The most bytes any kernel of an architecture may spill (stores or loads).
SPILL_BOUND = {"sm_90a": 0, "sm_80": 128}
SPILLS = re.compile(
    r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-values", "fp8-values"])
@pytest.mark.parametrize("pattern", ["samoyeds", "2:4"])
def test_every_planned_kernel_compiles_without_spilling(tmp_path, pattern, fp8, arch):
    if not shutil.which("nvcc"):
        pytest.skip("needs nvcc")
    names = compiled_kernels(torch.bfloat16, Pattern.parse(pattern), arch, fp8)
    source = tmp_path / "kernels.cu"
    # taking each kernel's address instantiates it, as CuPy's name expressions do for NVRTC
    addresses = "".join(f"    (void*)&{name},\n" for name in names)
    source.write_text(f'#include "{MAIN_SOURCE}"\nvoid* const kernels[] = {{\n{addresses}}};\n')
    command = ["nvcc", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-std=c++17", f"-I{CSRC}", "-c", str(source)]
    command += ["-o", str(tmp_path / "kernels.o"), "-Xptxas", "-v"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    assert len(re.findall(r"Compiling entry function", result.stderr)) >= len(names)
    spills = {name: (int(stores), int(loads)) for name, stores, loads in SPILLS.findall(result.stderr)}
    assert len(spills) >= len(names)
    over = {name: bytes_ for name, bytes_ in spills.items() if max(bytes_) > SPILL_BOUND[arch]}
    assert not over, f"{arch} kernels spilling more than {SPILL_BOUND[arch]} bytes (stores, loads): {over}"
