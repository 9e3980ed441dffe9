"""Packed expert weights as the kernels read them, and which ones they can run.

The kernels read the packed tensors of samoyeds_vllm.format in their own layout, which `prepare_weights` makes
once, when the plugin loads the weights:
- values and metadata are tiled: [E, R / 64, K / 128, 64, PER] (PER: the 64 values, or the 8 metadata halfwords,
  of one row and 128-input pipeline stage), so one stage of 64 rows is whole kilobytes of contiguous memory
  (tiled_offset in csrc/tiles.cuh says why). Their five dimensions mark the kernels' layout;
- FP8 values become uint8 bytes in the order of the mma.sp fragments (csrc/tiles.cuh, fp8_fragment): within
  each row's 64 values of a stage (4 k-steps of 16), thread t's four columns 2t, 2t+1, 2t+8, 2t+9 of each k-step
  come together, so a thread loads a whole stage of its row with one 16-byte read;
- rowsel [E, R, K/V] is stored segment-major ([E, K/V, R] in memory, same shape and values): the selections of a
  block's rows for one stage are then contiguous bytes, copied into shared memory with the stage (csrc/tiles.cuh,
  SelTile).
A forward that meets weights in another layout is refused; `checkpoint_layout` turns prepared weights back into
the format's (the reference implementation reads that).
"""

from __future__ import annotations

import torch

from ..errors import SamoyedsError
from ..format import FP8, PackedWeight
from .geometry import BK, SUPPORTED_DTYPES, TILE_ROWS
from .plan import MIN_ROW_BLOCK

FP8_KERNEL_ORDER = torch.uint8  # the dtype of FP8 values in the kernels' order


def _segment_major(rowsel: torch.Tensor) -> bool:
    return rowsel.transpose(-1, -2).is_contiguous()


def fp8_kernel_order(values: torch.Tensor) -> torch.Tensor:
    """FP8 values [..., R, K/2] as uint8 bytes in the fragment order of csrc/tiles.cuh (fp8_fragment): per row and
    stage of 64 values (k-step ks, column c = 8 hi + 2 t + lo), byte 16 t + 4 ks + 2 hi + lo."""
    *lead, rows, half_k = values.shape
    stages = values.view(torch.uint8).reshape(*lead, rows, half_k // 64, 4, 2, 4, 2)  # (ks, hi, t, lo)
    n = len(lead) + 2
    return stages.permute(*range(n), n + 2, n, n + 1, n + 3).reshape(*lead, rows, half_k).contiguous()


def fp8_checkpoint_order(values: torch.Tensor) -> torch.Tensor:
    """The inverse of fp8_kernel_order: float8 values in the packed format's order."""
    *lead, rows, half_k = values.shape
    stages = values.reshape(*lead, rows, half_k // 64, 4, 4, 2, 2)  # (t, ks, hi, lo)
    n = len(lead) + 2
    natural = stages.permute(*range(n), n + 1, n + 2, n, n + 3).reshape(*lead, rows, half_k).contiguous()
    return natural.view(FP8)


def _tiled(t: torch.Tensor) -> bool:
    return t.dim() == 5


def _tile(t: torch.Tensor, per_stage: int) -> torch.Tensor:
    """[E, R, C] (C = stages * per_stage), row-major -> [E, R / TILE_ROWS, stages, TILE_ROWS, per_stage]."""
    experts, rows, cols = t.shape
    if rows % TILE_ROWS:
        raise SamoyedsError(f"samoyeds kernels: packed weights need whole {TILE_ROWS}-row tiles, not {rows} rows")
    tiles = t.reshape(experts, rows // TILE_ROWS, TILE_ROWS, cols // per_stage, per_stage)
    return tiles.transpose(2, 3).contiguous()


def _untile(t: torch.Tensor) -> torch.Tensor:
    experts, tiles, stages, rows, per_stage = t.shape
    return t.transpose(2, 3).reshape(experts, tiles * rows, stages * per_stage).contiguous()


def prepare_weights(packed: PackedWeight) -> PackedWeight:
    """The packed weight [E, ...] in the kernels' layout: values (FP8: in fragment order) and metadata tiled, rowsel
    stored segment-major (copies; a prepared weight is returned as it is)."""
    rowsel = packed.rowsel
    if rowsel is not None and not _segment_major(rowsel):
        packed = packed._replace(rowsel=rowsel.transpose(-1, -2).contiguous().transpose(-1, -2))
    if _tiled(packed.values):
        return packed
    values = fp8_kernel_order(packed.values) if packed.values.dtype == FP8 else packed.values
    return packed._replace(values=_tile(values, BK // 2), meta=_tile(packed.meta, BK // 16))


def checkpoint_layout(packed: PackedWeight) -> PackedWeight:
    """The inverse of prepare_weights where it matters to other readers: values and metadata in the format's layout
    (FP8 values as float8 in its order); rowsel's storage order does not change what it reads."""
    if not _tiled(packed.values):
        return packed
    values = _untile(packed.values)
    if values.dtype == FP8_KERNEL_ORDER:
        values = fp8_checkpoint_order(values)
    return packed._replace(values=values, meta=_untile(packed.meta))


def dense_shape(packed: PackedWeight) -> tuple[int, int]:
    """(packed rows R, dense inputs K) per expert of a packed weight in either layout."""
    if _tiled(packed.values):
        _, tiles, stages, rows, _ = packed.values.shape
        return tiles * rows, stages * BK
    return packed.values.shape[1], packed.values.shape[2] * 2


def check_weights(**named: PackedWeight) -> None:
    """Refuse weights the kernels would misread (SamoyedsError naming the tensor), e.g. w13=..., w2=..."""
    for name, packed in named.items():
        for part, tensor in zip(("values", "meta"), packed[:2], strict=True):
            if not tensor.is_contiguous():
                raise SamoyedsError(f"samoyeds kernels: {name}_{part} must be contiguous")
        if packed.rowsel is not None and not _segment_major(packed.rowsel):
            raise SamoyedsError(
                f"samoyeds kernels: {name}_rowsel {tuple(packed.rowsel.shape)} is not stored segment-major; "
                "pass the weights through samoyeds_vllm.kernels.prepare_weights when loading them"
            )
        if packed.values.dtype == FP8 or not (_tiled(packed.values) and _tiled(packed.meta)):
            kind = "float8 values" if packed.values.dtype == FP8 else "values and metadata"
            raise SamoyedsError(
                f"samoyeds kernels: {name}: {kind} in the checkpoint's order; pass the weights through "
                "samoyeds_vllm.kernels.prepare_weights when loading them"
            )
        if (packed.values.dtype == FP8_KERNEL_ORDER) != (packed.scale is not None):
            raise SamoyedsError(f"samoyeds kernels: {name}: FP8 values need their scales, other values none")


def supports(dtype: torch.dtype, w13: PackedWeight, w2: PackedWeight) -> bool:
    """Whether the kernels run these activations and packed weights (else the reference implementation runs):
    bf16 / fp16 activations, values of their dtype or FP8 (either order), whole 64-row weight blocks (gate/up: per
    half) and whole 128-input k tiles."""
    (rows13, k13), (rows2, k2) = dense_shape(w13), dense_shape(w2)
    return (
        dtype in SUPPORTED_DTYPES
        and all(w.values.dtype in (dtype, FP8, FP8_KERNEL_ORDER) for w in (w13, w2))
        and rows13 % (2 * MIN_ROW_BLOCK) == 0
        and rows2 % MIN_ROW_BLOCK == 0
        and k13 % BK == 0
        and k2 % BK == 0
    )
