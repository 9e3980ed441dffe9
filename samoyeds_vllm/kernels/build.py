"""Compiling csrc/ at first use and finding its kernels.

The CUDA sources are compiled for the running GPU by NVRTC through CuPy (no compiler at install time), one module
per (dtype, pattern, GPU architecture, FP8 values or not) holding every kernel a plan can choose
(plan.compiled_kernels). CuPy caches the binaries on disk ($CUPY_CACHE_DIR, default ~/.cupy/kernel_cache) keyed by
the source and the options; the options carry a hash of every file in csrc/, since CuPy hashes only the main file's
text and not the headers it includes. Before CuPy 14.2 a module compiled with name expressions (ours) was never read
back from that cache: every process compiled it again. SAMOYEDS_LINEINFO=1 (profiling) compiles with -lineinfo, so
Nsight Compute's source page maps SASS to csrc lines (benchmarks/ncu_moe.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import warnings
from importlib import resources

import torch

from ..errors import SamoyedsError
from ..format import Pattern
from .geometry import CTYPES
from .plan import Occupancy, compiled_kernels

MAIN_SOURCE = "samoyeds_moe.cu"
#: The first CuPy that reads modules compiled with name expressions back from its disk cache.
CACHING_CUPY = (14, 2)


def _csrc():
    return resources.files("samoyeds_vllm.csrc")


@functools.cache
def _sources_hash() -> str:
    files = sorted((f for f in _csrc().iterdir() if f.name.endswith((".cu", ".cuh"))), key=lambda f: f.name)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def _cupy():
    try:
        import cupy
    except ImportError:
        raise SamoyedsError(
            "samoyeds GPU kernels are compiled at first use with CuPy: pip install samoyeds-vllm[gpu-cu13] (or "
            "[gpu-cu12] to match a CUDA 12 driver)"
        ) from None
    return cupy


def module(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool = False):
    """The compiled kernels of one dtype and pattern for one GPU architecture, for values of dtype or FP8 values
    (compiled once per process, loaded from CuPy's disk cache after the first time), loaded into the context of
    CuPy's current device: a CUfunction belongs to the context it was loaded in, so each GPU a process drives gets
    its own (call inside cupy.cuda.Device of the tensors' GPU)."""
    return _module(dtype, pattern, arch, fp8, _cupy().cuda.runtime.getDevice())


@functools.cache
def _module(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool, device: int):
    cupy = _cupy()
    if dtype not in CTYPES:
        raise SamoyedsError(f"the samoyeds GPU kernels run bf16 / fp16 activations, not {dtype}")
    _check_cuda_majors(cupy.cuda.runtime.runtimeGetVersion() // 1000, torch.version.cuda)
    _check_caching(cupy.__version__)
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


def _check_caching(cupy_version: str) -> None:
    """A CuPy before 14.2 works, but compiles every module again in every process (each engine start, each worker)."""
    if tuple(int(n) for n in re.findall(r"\d+", cupy_version)[:2]) < CACHING_CUPY:
        warnings.warn(
            f"CuPy {cupy_version} compiles the samoyeds kernels again in every process (it reads modules compiled "
            "with name expressions back from its disk cache only from 14.2): pip install -U 'cupy-cuda13x>=14.2' "
            "(or cupy-cuda12x)",
            stacklevel=2,
        )


def kernel(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool, name: str, shared_bytes: int = 0):
    """One kernel of the module of CuPy's current device, looked up once (the forward runs on every decode step),
    allowed `shared_bytes` of dynamic shared memory."""
    return _kernel(dtype, pattern, arch, fp8, name, shared_bytes, _cupy().cuda.runtime.getDevice())


@functools.cache
def _kernel(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool, name: str, shared_bytes: int, device: int):
    function = _module(dtype, pattern, arch, fp8, device).get_function(name)
    if shared_bytes:
        function.max_dynamic_shared_size_bytes = shared_bytes
    return function


@functools.cache
def occupancy(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool = False) -> Occupancy:
    """plan.Occupancy for the kernels of one module: blocks per SM from the driver's occupancy calculator, which
    knows the compiled kernel's registers as well as its shared memory; 0 for a kernel whose shared memory the GPU
    cannot give. The returned function must be called inside cupy.cuda.Device of the GPU; its answers are those
    of every GPU of the architecture (the same compiled kernels on the same SM), so they are cached per module."""

    @functools.cache
    def blocks_per_sm(name: str, threads: int, shared_bytes: int) -> int:
        import cupy

        try:
            function = kernel(dtype, pattern, arch, fp8, name, shared_bytes).kernel.ptr
            return cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function, threads, shared_bytes)
        except cupy.cuda.driver.CUDADriverError:
            return 0

    return blocks_per_sm


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute (cuda.h): an attribute id, then its value, a 64-byte union, at byte 8."""

    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h), the first argument of cuLaunchKernelEx."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def dependent_launches(arch: str) -> bool:
    """Whether the kernels compiled for `arch` are launched as programmatic dependent launches (csrc/ptx.cuh,
    grid_dependency_wait): from sm_90, where they wait in the kernel for the kernel before them; a kernel compiled
    for an older target has no such wait and must start after the one before it has finished.
    SAMOYEDS_DEPENDENT_LAUNCH=0 launches them in plain stream order (A/B timing, debugging)."""
    return int(re.search(r"\d+", arch)[0]) >= 90 and os.environ.get("SAMOYEDS_DEPENDENT_LAUNCH", "1") != "0"


def launch_config(grid: tuple[int, int, int], threads: int, shared_bytes: int, dependent: bool) -> LaunchConfig:
    """A launch's CUlaunchConfig, made once per plan; `launch` sets its stream. dependent: the launch may start
    while the kernel before it in the stream still runs (programmatic stream serialization)."""
    config = LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(threads, 1, 1))
    config.shared_bytes = shared_bytes
    if dependent:
        attribute = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        attribute.value[0] = 1  # programmaticStreamSerializationAllowed
        config.attrs, config.num_attrs = ctypes.pointer(attribute), 1
    return config


@functools.cache
def _cu_launch_kernel_ex():
    function = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    function.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


def launch(function: int, config: LaunchConfig, stream: int, args: int) -> None:
    """One launch through the driver's cuLaunchKernelEx (ctypes; CuPy binds only cuLaunchKernel, which takes no
    attributes) on the raw stream handle, with a config that launch_config made once per plan: what a forward asks
    of the host bounds vLLM's steps that run without CUDA graphs (H200, 2026-11-26, benchmarks/host_overhead.py).
    function: a CUfunction (`kernel(...).kernel.ptr`, looked up inside cupy.cuda.Device of the tensors' GPU); args:
    the address of the array of argument addresses; the driver copies the arguments at the launch, so a captured
    CUDA graph keeps their values. The config is shared by every forward of its plan, so each launch sets its
    stream in a copy (threads may launch one plan on different streams; the driver call releases the GIL)."""
    call = LaunchConfig.from_buffer_copy(config)  # its attribute pointer still points into `config`'s
    call.stream = stream
    status = _cu_launch_kernel_ex()(ctypes.byref(call), function, args, None)
    if status:
        raise SamoyedsError(f"cuLaunchKernelEx failed: CUresult {status} (cuda.h names the codes)")
