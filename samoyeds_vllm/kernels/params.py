"""The kernels' one parameter struct, MoEParams of csrc/params.cuh, on the host side.

Each dataclass below mirrors its C++ struct field for field (same names, same order); `Ptr` fields are device
pointers, `int` fields 32-bit integers. `struct_dtype` gives the C layout (`np.dtype(..., align=True)` follows the
C alignment rules) and `to_kernel_arg` packs an instance into those bytes, which cuLaunchKernel passes to a kernel
by value.
tests/unit/test_kernel_contract.py compiles the header and checks names, order, offsets and size.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import struct
import typing
from dataclasses import dataclass

import numpy as np
import torch

Ptr = typing.NewType("Ptr", int)  # a device address (0 for a null pointer)


def ptr(t: torch.Tensor | None) -> Ptr:
    return Ptr(0 if t is None else t.data_ptr())


@dataclass
class PackedExperts:
    values: Ptr
    meta: Ptr
    rowsel: Ptr
    scale: Ptr
    rows: int


@dataclass
class MoEParams:
    topk_ids: Ptr
    topk_weights: Ptr
    router_logits: Ptr
    renormalize: int
    tokens: int
    top_k: int
    slots: int
    num_experts: int
    hidden: int
    inter: int
    sorted_slot: Ptr
    sorted_weight: Ptr
    tiles: Ptr
    chunk_counts: Ptr
    token_tile: int
    num_tiles: int
    chunks: int
    few_token_map: int
    w13: PackedExperts
    x: Ptr
    x_fp8: Ptr
    x_scale: Ptr
    act: Ptr
    gate_up_partial: Ptr
    gate_up_splits: int
    w2: PackedExperts
    act_fp8: Ptr
    act_scale: Ptr
    y: Ptr
    down_splits: int
    out: Ptr


_SCALARS = {Ptr: np.uint64, int: np.int32}


@functools.cache
def struct_dtype(cls: type) -> np.dtype:
    """The NumPy dtype with the C layout of one of the dataclasses above."""
    hints = typing.get_type_hints(cls, globalns={**globals(), "Ptr": Ptr})
    fields = []
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        fields.append((field.name, struct_dtype(kind) if dataclasses.is_dataclass(kind) else _SCALARS[kind]))
    return np.dtype(fields, align=True)


_FORMATS = {np.dtype(np.uint64): "Q", np.dtype(np.int32): "i"}  # struct module codes of the _SCALARS


@functools.cache
def _packer(cls: type) -> tuple[operator.attrgetter, struct.Struct]:
    """How to_kernel_arg packs an instance of `cls`, read off struct_dtype: a getter of its scalar fields in the C
    order (dotted paths into nested structs) and a struct.Struct of the C layout (padding bytes zero). Cached: the
    forward packs one struct per call, in steps that run without CUDA graphs, where the host's time counts."""
    paths, fmt, end = [], "<", 0

    def walk(dtype: np.dtype, prefix: str, base: int) -> None:
        nonlocal fmt, end
        for name in dtype.names:
            sub, offset = dtype.fields[name][:2]
            if sub.names:
                walk(sub, f"{prefix}{name}.", base + offset)
                continue
            paths.append(prefix + name)
            fmt += "x" * (base + offset - end) + _FORMATS[sub]
            end = base + offset + sub.itemsize

    dtype = struct_dtype(cls)
    walk(dtype, "", 0)
    return operator.attrgetter(*paths), struct.Struct(fmt + "x" * (dtype.itemsize - end))


def to_kernel_arg(params: MoEParams) -> np.ndarray:
    """The bytes of `params` in the layout of the C++ struct (uint8, read-only): a kernel argument passed by
    value."""
    fields, layout = _packer(type(params))
    return np.frombuffer(layout.pack(*fields(params)), dtype=np.uint8)
