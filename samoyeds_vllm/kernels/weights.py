"""Packed expert weights as the kernels read them, and which ones they can run.

The kernels read the packed tensors of samoyeds_vllm.format as they are, with two layout changes that
`prepare_weights` makes once, when the plugin loads the weights:
- rowsel [E, R, K/V] is stored segment-major ([E, K/V, R] in memory, same shape and values): the selections of a
  block's rows for one stage are then contiguous bytes, copied into shared memory with the stage (csrc/tiles.cuh,
  SelTile);
- FP8 values become uint8 bytes in the order of the mma.sp fragments (csrc/gemm_mma.cuh, fp8_fragment): within
  each row's 64 values of a pipeline stage (4 k-steps of 16), thread t's four columns 2t, 2t+1, 2t+8, 2t+9 of each
  k-step come together, so a thread loads a whole stage of its row with one 16-byte read. FP8 values and their
  metadata are also tiled: each 64-row tile holds, stage by stage, its rows' values (4 KB) and metadata (1 KB)
  contiguously (fp8_tile_offset in csrc/gemm_mma.cuh says why). The uint8 dtype marks the kernels' order of values
  and metadata: a forward that meets float8 values, or rowsel in the checkpoint's layout, is refused.
"""

from __future__ import annotations

import torch

from ..errors import SamoyedsError
from ..format import FP8, PackedWeight
from .geometry import BK, SUPPORTED_DTYPES
from .plan import MIN_ROW_BLOCK

FP8_KERNEL_ORDER = torch.uint8  # the dtype of FP8 values in the kernels' order


def _segment_major(rowsel: torch.Tensor) -> bool:
    return rowsel.transpose(-1, -2).is_contiguous()


def fp8_kernel_order(values: torch.Tensor) -> torch.Tensor:
    """FP8 values [..., R, K/2] as uint8 bytes in the fragment order of csrc/gemm_mma.cuh: per row and stage of 64
    values (k-step ks, column c = 8 hi + 2 t + lo), byte 16 t + 4 ks + 2 hi + lo."""
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


TILE_ROWS = 64  # rows of a tile of FP8 values and metadata


def _tiles(t: torch.Tensor, per_stage: int, inverse: bool = False) -> torch.Tensor:
    """[..., R, C] with C = stages * per_stage, row-major -> stage-major within 64-row tiles (or back)."""
    *lead, rows, cols = t.shape
    if rows % TILE_ROWS:
        raise SamoyedsError(f"samoyeds kernels: FP8 weights need whole {TILE_ROWS}-row tiles, not {rows} rows")
    n = len(lead) + 1
    shape = (*lead, rows // TILE_ROWS, TILE_ROWS, cols // per_stage, per_stage)
    if inverse:
        shape = (*lead, rows // TILE_ROWS, cols // per_stage, TILE_ROWS, per_stage)
    return t.reshape(shape).transpose(n, n + 1).reshape(t.shape).contiguous()


def prepare_weights(packed: PackedWeight) -> PackedWeight:
    """The packed weight in the kernels' layout: rowsel stored segment-major, FP8 values in fragment order and with
    their metadata tiled (copies unless already so)."""
    rowsel = packed.rowsel
    if rowsel is not None and not _segment_major(rowsel):
        packed = packed._replace(rowsel=rowsel.transpose(-1, -2).contiguous().transpose(-1, -2))
    if packed.values.dtype == FP8:
        values = _tiles(fp8_kernel_order(packed.values), BK // 2)
        packed = packed._replace(values=values, meta=_tiles(packed.meta, BK // 16))
    return packed


def checkpoint_layout(packed: PackedWeight) -> PackedWeight:
    """The inverse of prepare_weights where it matters to other readers: FP8 values back in the format's order."""
    if packed.values.dtype == FP8_KERNEL_ORDER:
        values = fp8_checkpoint_order(_tiles(packed.values, BK // 2, inverse=True))
        return packed._replace(values=values, meta=_tiles(packed.meta, BK // 16, inverse=True))
    return packed


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
        if packed.values.dtype == FP8:
            raise SamoyedsError(
                f"samoyeds kernels: {name}_values are float8 in the checkpoint's order; pass the weights through "
                "samoyeds_vllm.kernels.prepare_weights when loading them"
            )
        if (packed.values.dtype == FP8_KERNEL_ORDER) != (packed.scale is not None):
            raise SamoyedsError(f"samoyeds kernels: {name}: FP8 values need their scales, other values none")


def supports(dtype: torch.dtype, w13: PackedWeight, w2: PackedWeight) -> bool:
    """Whether the kernels run these activations and packed weights (else the reference implementation runs):
    bf16 / fp16 activations, values of their dtype or FP8 (either order), whole 64-row weight blocks (gate/up: per
    half) and whole 128-input k tiles."""
    return (
        dtype in SUPPORTED_DTYPES
        and all(w.values.dtype in (dtype, FP8, FP8_KERNEL_ORDER) for w in (w13, w2))
        and w13.values.shape[1] % (2 * MIN_ROW_BLOCK) == 0
        and w2.values.shape[1] % MIN_ROW_BLOCK == 0
        and (w13.values.shape[2] * 2) % BK == 0
        and (w2.values.shape[2] * 2) % BK == 0
    )
