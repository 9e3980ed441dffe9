"""The kernels' one parameter struct, MoEParams of csrc/params.cuh, on the host side.

Each dataclass below mirrors its C++ struct field for field (same names, same order); `Ptr` fields are device
pointers, `int` fields 32-bit integers. `to_kernel_arg` packs an instance into a NumPy value with the C layout
(`np.dtype(..., align=True)` follows the C alignment rules), which CuPy passes to a kernel by value.
tests/unit/test_kernel_contract.py compiles the header and checks names, order, offsets and size.
"""

from __future__ import annotations

import dataclasses
import functools
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
    tokens: int
    top_k: int
    slots: int
    num_experts: int
    hidden: int
    inter: int
    sorted_slot: Ptr
    tile_expert: Ptr
    tile_start: Ptr
    tile_rows: Ptr
    chunk_counts: Ptr
    token_tile: int
    num_tiles: int
    chunks: int
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


def _as_tuple(value) -> tuple:
    return tuple(
        _as_tuple(getattr(value, f.name))
        if dataclasses.is_dataclass(getattr(value, f.name))
        else getattr(value, f.name)
        for f in dataclasses.fields(value)
    )


def to_kernel_arg(params: MoEParams) -> np.ndarray:
    """A 0-d array holding `params` in the layout of the C++ struct: a kernel argument passed by value."""
    return np.array(_as_tuple(params), dtype=struct_dtype(MoEParams))
