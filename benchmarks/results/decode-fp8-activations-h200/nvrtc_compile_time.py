"""Times NVRTC compiling the FP8 Hopper module of a pattern with and without the decode tiles' FP8-activation
kernels (no GPU needed: libnvrtc of the nvidia-cuda-nvrtc wheel, CUDA headers of the local toolkit).

    python nvrtc_compile_time.py samoyeds,2:4 > nvrtc-compile-time.log
"""

import ctypes
import sys
import time
from pathlib import Path

import nvidia.cu13
import torch

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.kernels import build
from samoyeds_vllm.kernels.plan import compiled_kernels

NVRTC = ctypes.CDLL(str(Path(nvidia.cu13.__path__[0]) / "lib" / "libnvrtc.so.13"))
CUDA_INCLUDE = "/usr/local/cuda/include"


def compile_seconds(names: list[str]) -> tuple[int, float]:
    source = (build._csrc() / build.MAIN_SOURCE).read_text().encode()
    program = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(program), source, build.MAIN_SOURCE.encode(), 0, None, None) == 0
    for name in names:
        assert NVRTC.nvrtcAddNameExpression(program, name.encode()) == 0
    options = [
        b"--gpu-architecture=sm_90a",
        b"-std=c++17",
        f"-I{CUDA_INCLUDE}".encode(),
        f"-I{CUDA_INCLUDE}/cccl".encode(),
        f"--include-path={build._csrc()}".encode(),
    ]
    start = time.time()
    rc = NVRTC.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    return rc, time.time() - start


for name in sys.argv[1].split(","):
    pattern = Pattern.parse(name)
    names = compiled_kernels(torch.bfloat16, pattern, "sm_90a", True)
    # moe_gemm<..., ACT8 = true>: the decode tiles' FP8-activation instantiations
    without = [n for n in names if not (n.startswith("samoyeds::moe_gemm<") and n.endswith("true>"))]
    print(name, len(names), len(without), [n for n in names if n not in without][:2], flush=True)
    for label, subset in (("without", without), ("with", names)):
        rc, seconds = compile_seconds(subset)
        print(f"{name} {label} decode-tile FP8 activations: {len(subset)} kernels, rc {rc}, {seconds:.1f} s", flush=True)
