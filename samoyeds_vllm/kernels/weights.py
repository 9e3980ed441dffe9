"""Packed expert weights as the kernels read them, and which ones they can run.

The kernels read the packed tensors of samoyeds_vllm.format as they are, except that rowsel [E, R, K/V] is stored
segment-major ([E, K/V, R] in memory, same shape and values): the selections of a block's rows for one stage are
then contiguous bytes, copied into shared memory with the stage (csrc/tiles.cuh, SelTile). `prepare_weights` makes
that layout once, when the plugin loads the weights; a forward that meets another layout is refused.
"""

from __future__ import annotations

import torch

from ..errors import SamoyedsError
from ..format import PackedWeight
from .geometry import BK, SUPPORTED_DTYPES
from .plan import MIN_ROW_BLOCK


def _segment_major(rowsel: torch.Tensor) -> bool:
    return rowsel.transpose(-1, -2).is_contiguous()


def prepare_weights(packed: PackedWeight) -> PackedWeight:
    """The packed weight in the kernels' layout: rowsel stored segment-major (a copy unless already so)."""
    rowsel = packed.rowsel
    if rowsel is None or _segment_major(rowsel):
        return packed
    return packed._replace(rowsel=rowsel.transpose(-1, -2).contiguous().transpose(-1, -2))


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


def supports(dtype: torch.dtype, w13: PackedWeight, w2: PackedWeight) -> bool:
    """Whether the kernels run these activations and packed weights (else the reference implementation runs):
    bf16 / fp16, whole 64-row weight blocks (gate/up: per half) and whole 128-input k tiles."""
    return (
        dtype in SUPPORTED_DTYPES
        and w13.values.dtype == dtype
        and w13.values.shape[1] % (2 * MIN_ROW_BLOCK) == 0
        and w2.values.shape[1] % MIN_ROW_BLOCK == 0
        and (w13.values.shape[2] * 2) % BK == 0
        and (w2.values.shape[2] * 2) % BK == 0
    )
