"""The contract between csrc/ and samoyeds_vllm/kernels/, checked with a host compiler on CPU: the parameter
struct (params.cuh) against its mirror in kernels/params.py (names, order, offsets, size), the constants of
config.cuh as kernels/geometry.py reads them, and the shared-memory stage sizes the plan asks for (tiles.cuh)."""

import ctypes
import dataclasses
import re
import shutil
import subprocess
import typing
from pathlib import Path

import pytest

from samoyeds_vllm.kernels import geometry, params
from samoyeds_vllm.kernels.geometry import BlockShape
from samoyeds_vllm.kernels.plan import block_shapes, token_tiles

CSRC = Path(__file__).resolve().parents[2] / "csrc"


def _fields(cls, prefix=""):
    """(dotted path, dtype offset) of every scalar field of a params dataclass, in order."""
    dtype = params.struct_dtype(cls)
    hints = typing.get_type_hints(cls, globalns=vars(params))
    out = []
    for f in dataclasses.fields(cls):
        offset = dtype.fields[f.name][1]
        if dataclasses.is_dataclass(hints[f.name]):
            out += [(f"{prefix}{f.name}.{name}", offset + sub) for name, sub in _fields(hints[f.name])]
        else:
            out.append((f"{prefix}{f.name}", offset))
    return out


def _struct_members(name: str) -> list[str]:
    """The member names of `struct name { ... }` in params.cuh, in order (one member per line there)."""
    text = (CSRC / "params.cuh").read_text()
    body = re.search(rf"struct {name} {{(.*?)\n}};", text, re.S)[1]
    code = [line.split("//")[0].strip() for line in body.splitlines()]
    return [re.search(r"(\w+);$", line)[1] for line in code if line]


def test_python_mirror_names_every_member_in_order():
    assert [f.name for f in dataclasses.fields(params.PackedExperts)] == _struct_members("PackedExperts")
    assert [f.name for f in dataclasses.fields(params.MoEParams)] == _struct_members("MoEParams")


def _compiler() -> list[str]:
    if shutil.which("nvcc"):
        return ["nvcc", "-x", "cu", "-std=c++17"]
    pytest.skip("needs nvcc to compile the CUDA headers on the host")


# build.LaunchConfig's fields and the CUlaunchConfig members they stand for
_LAUNCH_CONFIG_MEMBERS = [
    ("grid", "gridDimX"),
    ("block", "blockDimX"),
    ("shared_bytes", "sharedMemBytes"),
    ("stream", "hStream"),
    ("attrs", "attrs"),
    ("num_attrs", "numAttrs"),
]


@pytest.fixture(scope="module")
def compiled_layout(tmp_path_factory) -> dict[str, int]:
    """Offsets, sizes and constants printed by a host program built from the headers themselves."""
    fields = _fields(params.MoEParams)
    stages = sorted(
        {
            (bn, shape.a_rows, 1 if fp8 else 2, 1 if fp8_acts else 2)
            for samoyeds in (True, False)
            for hopper in (True, False)
            for fp8 in (True, False)
            for bn in token_tiles(samoyeds, hopper)
            for gate_up in (True, False)
            for shape in block_shapes(bn, gate_up, samoyeds, hopper, fp8)
            for fp8_acts in {False, fp8 and shape.kind == "ws"}
        }
    )
    lines = [
        "#include <cstddef>",
        "#include <cstdio>",
        "#include <cuda.h>",
        '#include "config.cuh"',
        '#include "params.cuh"',
        '#include "tiles.cuh"',
        '#include "one_token.cuh"',
        "using namespace samoyeds;",
        "int main() {",
        "  MoEParams p{};",
        '  printf("sizeof %zu\\n", sizeof(MoEParams));',
    ]
    lines += [f'  printf("{path} %zu\\n", (size_t)((char*)&p.{path} - (char*)&p));' for path, _ in fields]
    lines += [f'  printf("{name} %d\\n", {name});' for name in geometry.CONSTANTS]
    lines += [
        f'  printf("stage_{bn}_{rows}_{vb}_{ab} %zu\\n", sizeof(Stage<{bn}, {rows}, {vb}, {str(ab == 1).lower()}>));'
        for bn, rows, vb, ab in stages
    ]
    lines += [
        f'  printf("one_token_stage_{mt}_{vb} %zu\\n", sizeof(OneTokenStage<{mt}, {vb}>));'
        for mt in (1, 2)
        for vb in (1, 2)
    ]
    # build.py's ctypes mirrors of cuLaunchKernelEx's structs
    lines += [
        '  printf("CUlaunchConfig %zu\\n", sizeof(CUlaunchConfig));',
        '  printf("CUlaunchAttribute %zu\\n", sizeof(CUlaunchAttribute));',
        '  printf("CUlaunchAttribute.value %zu\\n", offsetof(CUlaunchAttribute, value));',
        '  printf("PROGRAMMATIC_STREAM_SERIALIZATION %d\\n", '
        "(int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);",
    ]
    lines += [
        f'  printf("CUlaunchConfig.{name} %zu\\n", offsetof(CUlaunchConfig, {member}));'
        for name, member in _LAUNCH_CONFIG_MEMBERS
    ]
    lines += ["  return 0;", "}"]
    work = tmp_path_factory.mktemp("contract")
    (work / "layout.cu").write_text("\n".join(lines) + "\n")
    build = subprocess.run(
        [*_compiler(), "-I", str(CSRC), "-o", str(work / "layout"), str(work / "layout.cu")],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(work / "layout")], capture_output=True, text=True, check=True)
    return {key: int(value) for key, value in (line.split() for line in run.stdout.splitlines())}


def test_parameter_struct_layout_matches(compiled_layout):
    assert compiled_layout["sizeof"] == params.struct_dtype(params.MoEParams).itemsize
    for path, offset in _fields(params.MoEParams):
        assert compiled_layout[path] == offset, path


def test_constants_are_read_as_compiled(compiled_layout):
    assert geometry.CONSTANTS and all(compiled_layout[k] == v for k, v in geometry.CONSTANTS.items())


def test_stage_sizes_match_the_plans_shared_memory(compiled_layout):
    for key, size in compiled_layout.items():
        if key.startswith("stage_"):
            _, bn, rows, value_bytes, act_bytes = key.split("_")
            assert geometry.stage_bytes(int(bn), int(rows), int(value_bytes), int(act_bytes)) == size, key
    assert BlockShape("ws", 8, 2).a_rows == 256
    one_token = {key: size for key, size in compiled_layout.items() if key.startswith("one_token_stage_")}
    assert len(one_token) == 4
    for key, size in one_token.items():
        slabs, value_bytes = map(int, key.split("_")[-2:])
        assert geometry.one_token_stage_bytes(slabs, value_bytes) == size, key


#: The start of a kernel's definition in csrc/, up to its name and the parenthesis after it.
KERNEL_DEFINITION = r"__global__ void (?:__launch_bounds__\([^)]*\)\s+)?(\w+)\("


def test_every_kernel_takes_the_one_parameter_struct():
    """No kernel of csrc/ takes positional launch arguments: each __global__ function's parameter list is one
    MoEParams, so the host fills one struct (kernels/launch.py) instead of mirroring argument lists."""
    kernels = 0
    for path in CSRC.glob("*.cu*"):
        for name, params_list in re.findall(KERNEL_DEFINITION + r"([^)]*)\)", path.read_text()):
            kernels += 1
            assert params_list == "const __grid_constant__ MoEParams p", (path.name, name, params_list)
    assert kernels == 9  # 3 routing, 2 GEMM, 2 reductions, the FP8 quantization of activations, one token


def test_launch_structs_match_cuda_h(compiled_layout):
    """The ctypes mirrors build.launch hands cuLaunchKernelEx have cuda.h's sizes and offsets."""
    from samoyeds_vllm.kernels import build

    assert compiled_layout["CUlaunchConfig"] == ctypes.sizeof(build.LaunchConfig)
    for name, _ in _LAUNCH_CONFIG_MEMBERS:
        assert compiled_layout[f"CUlaunchConfig.{name}"] == getattr(build.LaunchConfig, name).offset, name
    assert compiled_layout["CUlaunchAttribute"] == ctypes.sizeof(build.LaunchAttribute)
    assert compiled_layout["CUlaunchAttribute.value"] == build.LaunchAttribute.value.offset
    assert compiled_layout["PROGRAMMATIC_STREAM_SERIALIZATION"] == build.PROGRAMMATIC_STREAM_SERIALIZATION


def test_a_launch_passes_cuLaunchKernelEx_its_config_and_the_struct_address(monkeypatch):
    """build.launch hands cuLaunchKernelEx the config (grid, block, shared memory, the raw stream, and from sm_90
    the programmatic-serialization attribute), the CUfunction and the kernelParams array (here a fake driver
    function records the call: no GPU on CI); a failing launch raises."""
    import numpy as np

    from samoyeds_vllm.errors import SamoyedsError
    from samoyeds_vllm.kernels import build

    calls = []

    def fake(config, function, args, extra):
        c = config._obj
        attrs = [(c.attrs[i].id, c.attrs[i].value[0]) for i in range(c.num_attrs)]
        calls.append((tuple(c.grid), tuple(c.block), c.shared_bytes, c.stream, attrs, function, args, extra))
        return 0 if function != 0xBAD else 500

    monkeypatch.setattr(build, "_cu_launch_kernel_ex", lambda: fake)
    monkeypatch.delenv("SAMOYEDS_DEPENDENT_LAUNCH", raising=False)
    struct = np.zeros((), dtype=params.struct_dtype(params.MoEParams))
    addresses = np.array([struct.ctypes.data], dtype=np.uintp)
    hopper = build.launch_config((3, 2, 4), 384, 99 * 1024, build.dependent_launches("sm_90a"))
    ampere = build.launch_config((7, 1, 1), 128, 0, build.dependent_launches("sm_80"))
    build.launch(0xF00, hopper, 0x5, addresses.ctypes.data)
    build.launch(0xF00, ampere, 0x6, addresses.ctypes.data)
    assert calls == [
        ((3, 2, 4), (384, 1, 1), 99 * 1024, 0x5, [(6, 1)], 0xF00, addresses.ctypes.data, None),
        ((7, 1, 1), (128, 1, 1), 0, 0x6, [], 0xF00, addresses.ctypes.data, None),
    ]
    assert int(np.frombuffer(addresses.tobytes(), np.uintp)[0]) == struct.ctypes.data  # kernelParams[0] -> struct
    with pytest.raises(SamoyedsError, match="CUresult 500"):
        build.launch(0xBAD, ampere, 0x6, addresses.ctypes.data)
    archs = ("sm_80", "sm_89", "sm_90", "compute_90a", "sm_100a", "sm_120")
    assert [build.dependent_launches(arch) for arch in archs] == [False, False, True, True, True, True]
    assert hopper.stream is None  # each launch set its stream in a copy
    monkeypatch.setenv("SAMOYEDS_DEPENDENT_LAUNCH", "0")
    assert not build.dependent_launches("sm_90a")


def test_every_kernel_waits_for_the_kernel_before_it():
    """From sm_90 every launch may start before the kernel before it has finished (build.dependent_launches), so
    each kernel of csrc/ calls grid_dependency_wait, itself or in the body it calls; a kernel without it would read
    its inputs before they are written."""
    text = "".join(path.read_text() for path in sorted(CSRC.glob("*.cu*")))
    kernels = list(re.finditer(KERNEL_DEFINITION + r"(.*?)\n}\n", text, re.S))
    assert len(kernels) == 9
    for match in kernels:
        name, body = match[1], match[2]
        called_body = re.search(r"(\w+_body)<", body)
        if called_body:
            definition = re.search(rf"void {called_body[1]}\((.*?)\n}}\n", text, re.S)
            body += definition[1]
        assert re.search(r"\bgrid_dependency_wait\(\)", body), name


def test_kernel_arg_bytes_hold_every_field_at_its_offset():
    """to_kernel_arg's bytes, read back through the struct's NumPy layout, give each field its own value (distinct
    values, so a field packed at another's offset shows), with the padding bytes zero."""
    import numpy as np

    values = iter(range(1, 100))

    def fill(cls):
        hints = typing.get_type_hints(cls, globalns=vars(params))
        fields = {}
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            shift = 33 if kind is params.Ptr else 0  # pointers past 32 bits
            fields[f.name] = fill(kind) if dataclasses.is_dataclass(kind) else next(values) << shift
        return cls(**fields)

    arg = params.to_kernel_arg(fill(params.MoEParams))
    dtype = params.struct_dtype(params.MoEParams)
    assert arg.dtype == np.uint8 and arg.nbytes == dtype.itemsize
    read = arg.view(dtype)[0]
    expected = iter(range(1, 100))
    for path, _ in _fields(params.MoEParams):
        value = read
        for name in path.split("."):
            value = value[name]
        assert int(value) == next(expected) << (33 if value.dtype == np.uint64 else 0), path
    covered = np.zeros(dtype.itemsize, dtype=bool)

    def cover(dt, base):
        for name in dt.names:
            sub, offset = dt.fields[name][:2]
            if sub.names:
                cover(sub, base + offset)
            else:
                covered[base + offset : base + offset + sub.itemsize] = True

    cover(dtype, 0)
    assert not covered.all() and not arg[~covered].any()


def test_each_gpu_gets_its_own_module_and_kernels(monkeypatch):
    """A CUfunction belongs to the context it was loaded in: build.module and build.kernel load the kernels once
    for each GPU a process drives (CuPy's current device), not once per process (a fake CuPy: no GPU on CI)."""
    import sys
    import types

    import torch

    from samoyeds_vllm.format import Pattern
    from samoyeds_vllm.kernels import build

    current = {"device": 0}
    loaded = []

    class FakeModule:
        def __init__(self, code, options, name_expressions):
            self.device = current["device"]
            loaded.append(self.device)

        def compile(self):
            pass

        def get_function(self, name):
            return types.SimpleNamespace(device=self.device, name=name)

    runtime = types.SimpleNamespace(getDevice=lambda: current["device"], runtimeGetVersion=lambda: 13000)
    compiler = types.SimpleNamespace(CompileException=RuntimeError)
    cupy = types.SimpleNamespace(
        __version__="14.2.0", RawModule=FakeModule, cuda=types.SimpleNamespace(runtime=runtime, compiler=compiler)
    )
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    build._module.cache_clear()
    build._kernel.cache_clear()
    try:
        args = (torch.bfloat16, Pattern("samoyeds", 128), "sm_90a", True)
        first = build.kernel(*args, "samoyeds::build_routing_index")
        current["device"] = 1
        second = build.kernel(*args, "samoyeds::build_routing_index")
        current["device"] = 0
        again = build.kernel(*args, "samoyeds::build_routing_index")
        assert (first.device, second.device) == (0, 1) and again is first
        assert loaded == [0, 1] and build.module(*args).device == 0
    finally:
        build._module.cache_clear()
        build._kernel.cache_clear()


@pytest.mark.parametrize(
    "version, warns", [("14.1.0", True), ("13.6.0", True), ("14.2.0", False), ("15.0.0rc1", False)]
)
def test_a_cupy_that_compiles_the_kernels_in_every_process_is_named(version, warns, recwarn):
    """CuPy reads modules compiled with name expressions back from its disk cache only from 14.2; before it every
    engine start compiles every module again (it still works: a warning, not an error)."""
    from samoyeds_vllm.kernels import build

    build._check_caching(version)
    found = [str(w.message) for w in recwarn if "compiles the samoyeds kernels again" in str(w.message)]
    assert bool(found) is warns
    if warns:
        assert f"CuPy {version}" in found[0] and ">=14.2" in found[0]
