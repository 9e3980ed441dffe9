"""Compiling csrc/ at first use and finding its kernels.

The CUDA sources are compiled for the running GPU by NVRTC through CuPy (no compiler at install time), one module
per (dtype, pattern, GPU architecture, FP8 values or not) holding every kernel a plan can choose
(plan.compiled_kernels). CuPy caches the binaries on disk ($CUPY_CACHE_DIR, default ~/.cupy/kernel_cache) keyed by
the source and the options; the options carry a hash of every file in csrc/, since CuPy hashes only the main file's
text and not the headers it includes. SAMOYEDS_LINEINFO=1 (profiling) compiles with -lineinfo, so Nsight Compute's
source page maps SASS to csrc lines (benchmarks/ncu_moe.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
from importlib import resources

import torch

from ..errors import SamoyedsError
from ..format import Pattern
from .geometry import CTYPES
from .plan import Occupancy, compiled_kernels

MAIN_SOURCE = "samoyeds_moe.cu"


def _csrc():
    return resources.files("samoyeds_vllm.csrc")


@functools.cache
def _sources_hash() -> str:
    files = sorted((f for f in _csrc().iterdir() if f.name.endswith((".cu", ".cuh"))), key=lambda f: f.name)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def module(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool = False):
    """The compiled kernels of one dtype and pattern for one GPU architecture, for values of dtype or FP8 values
    (compiled once per process, loaded from CuPy's disk cache after the first time)."""
    try:
        import cupy
    except ImportError:
        raise SamoyedsError(
            "samoyeds GPU kernels are compiled at first use with CuPy: pip install samoyeds-vllm[gpu-cu13] (or "
            "[gpu-cu12] to match a CUDA 12 driver)"
        ) from None
    if dtype not in CTYPES:
        raise SamoyedsError(f"the samoyeds GPU kernels run bf16 / fp16 activations, not {dtype}")
    _check_cuda_majors(cupy.cuda.runtime.runtimeGetVersion() // 1000, torch.version.cuda)
    options = (
        f"--gpu-architecture={arch}",
        "-std=c++17",
        f"--include-path={_csrc()}",
        f"-DSAMOYEDS_SOURCES={_sources_hash()}",  # a header change makes a new cache entry
    ) + (("-lineinfo",) if os.environ.get("SAMOYEDS_LINEINFO") else ())
    source = (_csrc() / MAIN_SOURCE).read_text()
    try:
        compiled = cupy.RawModule(
            code=source, options=options, name_expressions=compiled_kernels(dtype, pattern, arch, fp8)
        )
        compiled.compile()
    except cupy.cuda.compiler.CompileException as e:
        raise SamoyedsError(f"compiling csrc/{MAIN_SOURCE} for {arch} failed:\n{e}") from None
    return compiled


def _check_cuda_majors(cupy_major: int, torch_cuda: str | None) -> None:
    """CuPy's wheel is built for one CUDA major; a CuPy for another CUDA than torch's fails in obscure ways."""
    torch_major = int(torch_cuda.split(".")[0]) if torch_cuda else None
    if torch_major is not None and torch_major != cupy_major:
        raise SamoyedsError(
            f"CuPy is built for CUDA {cupy_major} but torch for CUDA {torch_cuda}: install the matching extra, "
            f"pip install samoyeds-vllm[gpu-cu{torch_major}] (cupy-cuda{torch_major}x)"
        )


@functools.cache
def kernel(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool, name: str, shared_bytes: int = 0):
    """One kernel of the module, looked up once (the forward runs on every decode step), allowed `shared_bytes`
    of dynamic shared memory."""
    function = module(dtype, pattern, arch, fp8).get_function(name)
    if shared_bytes:
        function.max_dynamic_shared_size_bytes = shared_bytes
    return function


@functools.cache
def occupancy(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool = False) -> Occupancy:
    """plan.Occupancy for the kernels of one module: blocks per SM from the driver's occupancy calculator, which
    knows the compiled kernel's registers as well as its shared memory; 0 for a kernel whose shared memory the GPU
    cannot give. The returned function must be called inside cupy.cuda.Device of the GPU."""

    @functools.cache
    def blocks_per_sm(name: str, threads: int, shared_bytes: int) -> int:
        import cupy

        try:
            function = kernel(dtype, pattern, arch, fp8, name, shared_bytes).kernel.ptr
            return cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function, threads, shared_bytes)
        except cupy.cuda.driver.CUDADriverError:
            return 0

    return blocks_per_sm


def launch(function: int, grid: tuple[int, int, int], threads: int, shared_bytes: int, stream: int, args: int) -> None:
    """One launch through CuPy's binding of cuLaunchKernel on the raw stream handle. CuPy's own kernel call works
    out a C type for a NumPy struct argument on every launch (NumPy's dtype.descr over MoEParams' fields): that was
    about half of the layer's host time, which bounds vLLM's steps that run without CUDA graphs (H200,
    2026-11-26, benchmarks/host_overhead.py). function: a CUfunction (`kernel(...).kernel.ptr`, looked up inside
    cupy.cuda.Device of the tensors' GPU); args: the address of the array of argument addresses that
    cuLaunchKernel takes; it copies the arguments at the launch, so a captured CUDA graph keeps their values."""
    import cupy

    cupy.cuda.driver.launchKernel(function, *grid, threads, 1, 1, shared_bytes, stream, args, 0)
