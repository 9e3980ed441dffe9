"""The packed layout (format version 1), and moving dense weights onto a pattern and into it.

The one place the layout is defined. The CPU reference path and the GPU kernels read exactly these tensors;
r = m for 2:4 and r = m/2 for samoyeds (one condensed row per row pair)::

    values  [..., r, k/2]   dtype of W. For each group of 4 inputs, its 2 kept values, lower position first.
    meta    [..., r, k/16]  int16. One half-word per 16 inputs (4 groups); group c (0..3) in bits 4c..4c+3 as
                            p0 | p1 << 2, the positions 0 <= p0 < p1 <= 3 of its two kept values. This is the
                            sparse tensor cores' "ordered metadata" for one row and 16 dense columns, so a thread
                            of `mma.sp` / `wgmma.sp` builds its 32-bit selector as meta[row g] | meta[row g+8] << 16.
                            A group with fewer than two non-zeros still names two positions (zeros are stored).
    rowsel  [..., m/2, k/V] uint8, samoyeds only: 0 keeps row 2i, 1 keeps row 2i+1, in segment s of pair i.
    scale   [..., m]        float32, quantized values only (format version 2): values are float8_e4m3fn and the
                            weight is values * scale of the value's dense output row. One scale per output row
                            (not per 128 x 128 block) because the kernels then apply it once per output, in the
                            epilogue, after the samoyeds fold has split each row pair into its two rows.

`prune` projects a dense tensor onto a pattern by a score (magnitude unless given; calibrated scores come from
samoyeds_vllm.tools), `compress` / `decompress` convert between the pruned dense tensor and the packed one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..errors import PatternError
from .checkpoint import SUFFIXES
from .pattern import GROUP, META_SPAN, SUPPORTED_DTYPES, Pattern

_INT_OF_SIZE = {2: torch.int16, 4: torch.int32}


#: The quantized value type, and its largest finite magnitude (the scale maps each row's largest kept value there).
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


class PackedWeight(NamedTuple):
    values: torch.Tensor
    meta: torch.Tensor
    rowsel: torch.Tensor | None = None
    scale: torch.Tensor | None = None

    def named(self, prefix: str) -> dict[str, torch.Tensor]:
        """Checkpoint tensors for the weight `prefix.weight` (prefix without the trailing `.weight`)."""
        return {f"{prefix}.{SUFFIXES[k]}": t for k, t in self._asdict().items() if t is not None}


def _check_dtype(w: torch.Tensor, name: str) -> None:
    if w.dtype not in SUPPORTED_DTYPES:
        raise PatternError(f"{name}: dtype {w.dtype} is not supported; use float32, bfloat16 or float16")


def _nonzero_rank(w: torch.Tensor) -> torch.Tensor:
    """2 for a non-zero value, 1 for a negative zero (kept so round trips are bit-exact), 0 for +0.0."""
    bits_set = w.view(_INT_OF_SIZE[w.element_size()]) != 0
    return (w != 0).to(torch.int32) + bits_set.to(torch.int32)


# ----------------------------------------------------------------------------------------------- pruning


def prune_mask(scores: torch.Tensor, pattern: Pattern, name: str = "weight") -> torch.Tensor:
    """Boolean mask [..., m, k] of the weights to keep: the pattern-valid choice of largest total score.

    2:4 keeps the 2 best of every 4 (the earlier of equal scores: the same mask on every device, where topk breaks
    ties its own way on each, and FP8 checkpoints' weights tie often). Samoyeds keeps, per row pair and segment, the
    row whose 2:4-pruned score is larger (row 2i on ties), then 2:4 inside it: this maximises the kept score over
    all valid masks.
    """
    pattern.check_shape(scores.shape, name)
    *lead, m, k = scores.shape
    # NaN scores (a damaged checkpoint converted with allow_nonfinite) count as the largest, as in topk
    groups = scores.float().nan_to_num(nan=math.inf, posinf=math.inf, neginf=-math.inf)
    groups = groups.reshape(*lead, m, k // GROUP, GROUP)
    # rank[i]: how many of its group come first (a larger score, or an equal one earlier); one byte per weight
    rank = torch.zeros(groups.shape, dtype=torch.uint8, device=scores.device)
    for j in range(GROUP):
        first = groups[..., j : j + 1] > groups
        first[..., j + 1 :] |= groups[..., j : j + 1] == groups[..., j + 1 :]
        rank += first
    mask = rank < 2
    if not pattern.is_samoyeds:
        return mask.reshape(*lead, m, k)
    n_seg = k // pattern.segment
    top_sums = torch.where(mask, groups, 0.0).sum(-1)
    mask = mask.reshape(*lead, m, k)
    kept_score = top_sums.reshape(*lead, m // 2, 2, n_seg, pattern.segment // GROUP).sum(-1)
    second_row = kept_score[..., 1, :] > kept_score[..., 0, :]  # [..., m/2, S]
    row_kept = torch.stack([~second_row, second_row], dim=-2)  # [..., m/2, 2, S]
    row_kept = row_kept.unsqueeze(-1).expand(*lead, m // 2, 2, n_seg, pattern.segment).reshape(*lead, m, k)
    return mask & row_kept


def prune(w: torch.Tensor, pattern: Pattern, scores: torch.Tensor | None = None, name: str = "weight") -> torch.Tensor:
    """Project `w` onto the pattern: keep the entries `prune_mask` picks (by |w| unless `scores` is given),
    zero (+0.0) the rest. A tensor that already satisfies the pattern is returned unchanged."""
    _check_dtype(w, name)
    if scores is not None and scores.shape != w.shape:
        raise PatternError(f"{name}: scores shape {tuple(scores.shape)} differs from weight {tuple(w.shape)}")
    if satisfies(w, pattern, name):
        return w.clone()
    mask = prune_mask(w.abs() if scores is None else scores, pattern, name)
    return torch.where(mask, w, torch.zeros((), dtype=w.dtype, device=w.device))


# ------------------------------------------------------------------------------------------- validation


def _first_violation(w: torch.Tensor, pattern: Pattern) -> str | None:
    *lead, m, k = w.shape
    nonzero = w != 0
    if pattern.is_samoyeds:
        n_seg = k // pattern.segment
        row_used = nonzero.reshape(*lead, m // 2, 2, n_seg, pattern.segment).any(-1)  # [..., m/2, 2, S]
        both = row_used.all(-2)
        if both.any():
            *where, pair, seg = (int(i) for i in both.nonzero()[0])
            at = f"expert {where[0]}, " if where else ""
            return (
                f"{at}rows {2 * pair} and {2 * pair + 1} both have non-zeros in inputs "
                f"{seg * pattern.segment}..{(seg + 1) * pattern.segment - 1}"
            )
    too_many = nonzero.reshape(*lead, m, k // GROUP, GROUP).sum(-1) > 2
    if too_many.any():
        *where, row, group = (int(i) for i in too_many.nonzero()[0])
        at = f"expert {where[0]}, " if where else ""
        return f"{at}row {row} has more than 2 non-zeros in inputs {GROUP * group}..{GROUP * group + 3}"
    return None


def satisfies(w: torch.Tensor, pattern: Pattern, name: str = "weight") -> bool:
    """Does the dense tensor already satisfy the pattern (so that packing it loses nothing)?"""
    pattern.check_shape(w.shape, name)
    return _first_violation(w, pattern) is None


def check(w: torch.Tensor, pattern: Pattern, name: str = "weight") -> None:
    """Raise PatternError naming the tensor and the first place where `w` breaks the pattern."""
    pattern.check_shape(w.shape, name)
    problem = _first_violation(w, pattern)
    if problem:
        raise PatternError(f"{name} does not satisfy the {pattern} pattern: {problem}")


# ------------------------------------------------------------------------------------------ compression


def _compress_2of4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, rows, k = w.shape
    groups = w.reshape(*lead, rows, k // GROUP, GROUP)
    position = torch.arange(GROUP, device=w.device, dtype=torch.int32)
    # Keep the non-zeros; fill up with the lowest free positions, so the choice is deterministic.
    key = _nonzero_rank(groups) * GROUP + (GROUP - 1 - position)
    kept = key.topk(2, dim=-1).indices.sort(dim=-1).values  # [..., rows, k/4, 2], p0 < p1
    values = groups.gather(-1, kept).reshape(*lead, rows, k // 2)
    nibble = (kept[..., 0] | (kept[..., 1] << 2)).to(torch.int32)  # [..., rows, k/4]
    shifts = torch.arange(0, 16, 4, device=w.device, dtype=torch.int32)
    word = (nibble.reshape(*lead, rows, k // META_SPAN, 4) << shifts).sum(-1)  # 0 .. 0xFFFF
    meta = torch.where(word >= 1 << 15, word - (1 << 16), word).to(torch.int16)
    return values, meta


def _meta_positions(meta: torch.Tensor) -> torch.Tensor:
    """[..., rows, k/16] int16 -> kept positions [..., rows, k/4, 2] (int64)."""
    word = meta.to(torch.int32) & 0xFFFF
    shifts = torch.arange(0, 16, 4, device=meta.device, dtype=torch.int32)
    nibble = (word.unsqueeze(-1) >> shifts) & 0xF  # [..., rows, k/16, 4]
    nibble = nibble.reshape(*meta.shape[:-1], meta.shape[-1] * 4)
    return torch.stack([nibble & 3, nibble >> 2], dim=-1).long()


def _decompress_2of4(values: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    *lead, rows, half_k = values.shape
    k = half_k * 2
    out = torch.zeros(*lead, rows, k // GROUP, GROUP, dtype=values.dtype, device=values.device)
    out.scatter_(-1, _meta_positions(meta), values.reshape(*lead, rows, k // GROUP, 2))
    return out.reshape(*lead, rows, k)


def compress(w: torch.Tensor, pattern: Pattern, name: str = "weight") -> PackedWeight:
    """Pack a dense tensor that satisfies the pattern (PatternError otherwise). Exact: `decompress` gives
    back `w` bit for bit (a kept value may be -0.0; dropped entries come back as +0.0)."""
    _check_dtype(w, name)
    check(w, pattern, name)
    if not pattern.is_samoyeds:
        return PackedWeight(*_compress_2of4(w))
    *lead, m, k = w.shape
    n_seg, seg = k // pattern.segment, pattern.segment
    pairs = w.reshape(*lead, m // 2, 2, n_seg, seg)
    rank = _nonzero_rank(pairs).amax(-1)  # [..., m/2, 2, S]
    rowsel = (rank[..., 1, :] > rank[..., 0, :]).to(torch.uint8)  # [..., m/2, S]
    index = rowsel.long()[..., None, :, None].expand(*lead, m // 2, 1, n_seg, seg)
    kept_rows = pairs.gather(-3, index).reshape(*lead, m // 2, k)
    return PackedWeight(*_compress_2of4(kept_rows), rowsel)


def decompress(packed: PackedWeight, pattern: Pattern) -> torch.Tensor:
    """Dense [..., m, k] tensor of a packed weight (zeros where the pattern dropped weights); float32 values * scale
    for quantized values."""
    values = packed.values
    if packed.scale is not None:
        values = values.float() * value_scales(packed, pattern)
    kept_rows = _decompress_2of4(values, packed.meta)
    if not pattern.is_samoyeds:
        return kept_rows
    *lead, half_m, k = kept_rows.shape
    n_seg, seg = k // pattern.segment, pattern.segment
    out = torch.zeros(*lead, half_m, 2, n_seg, seg, dtype=kept_rows.dtype, device=kept_rows.device)
    index = packed.rowsel.long()[..., None, :, None].expand(*lead, half_m, 1, n_seg, seg)
    out.scatter_(-3, index, kept_rows.reshape(*lead, half_m, 1, n_seg, seg))
    return out.reshape(*lead, half_m * 2, k)


# ------------------------------------------------------------------------------------------- quantization


def _rows_of_values(packed: PackedWeight, pattern: Pattern) -> torch.Tensor | None:
    """samoyeds: the dense row (0 or 1 within its pair) of every packed value [..., r, k/2]; 2:4: None (row r)."""
    if not pattern.is_samoyeds:
        return None
    return packed.rowsel.repeat_interleave(pattern.segment // 2, dim=-1)


def value_scales(packed: PackedWeight, pattern: Pattern) -> torch.Tensor:
    """The scale of every packed value [..., r, k/2] (float32): its dense output row's."""
    scale = packed.scale.float()
    *lead, r, half_k = packed.values.shape
    if not pattern.is_samoyeds:
        return scale.unsqueeze(-1).expand(*lead, r, half_k)
    pairs = scale.reshape(*lead, r, 2)
    return pairs.gather(-1, _rows_of_values(packed, pattern).long())


def quantize(packed: PackedWeight, pattern: Pattern, dtype: torch.dtype = FP8) -> PackedWeight:
    """The packed weight with float8 e4m3 values and one float32 scale per dense output row: the row's largest kept
    magnitude maps to FP8_MAX (rows without non-zeros get scale 1), values rounded to nearest. Metadata and row
    selections stay, so the kept positions are the unquantized weight's."""
    if dtype != FP8:
        raise PatternError(f"values can be quantized to {FP8}, not {dtype}")
    magnitude = packed.values.float().abs()
    *lead, r, half_k = magnitude.shape
    if pattern.is_samoyeds:  # largest kept magnitude of each dense row: rows 2i, 2i + 1 share condensed row i
        rows = _rows_of_values(packed, pattern).bool()
        zero = torch.zeros((), dtype=magnitude.dtype, device=magnitude.device)
        even, odd = torch.where(rows, zero, magnitude).amax(-1), torch.where(rows, magnitude, zero).amax(-1)
        row_max = torch.stack([even, odd], dim=-1).reshape(*lead, 2 * r)
    else:
        row_max = magnitude.amax(-1)
    scale = torch.where(row_max > 0, row_max / FP8_MAX, torch.ones((), device=row_max.device))
    quantized = packed._replace(scale=scale)
    values = (packed.values.float() / value_scales(quantized, pattern)).clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return quantized._replace(values=values)


def nonfinite_count(t: torch.Tensor) -> int:
    """NaN / Inf entries of a weight tensor (float8 e4m3 has NaN only: all exponent and mantissa bits set)."""
    if t.dtype == FP8:
        return int(((t.view(torch.uint8) & 0x7F) == 0x7F).sum())
    return int((~torch.isfinite(t)).sum()) if t.is_floating_point() else 0


def check_packed(packed: PackedWeight, pattern: Pattern, dense_shape: tuple[int, ...], name: str = "weight") -> None:
    """Raise PatternError naming the tensor if packed tensors have the wrong shapes or dtypes, metadata that
    names an invalid pair of positions, row selectors other than 0 and 1, or (quantized values) scales that are
    not finite and positive (a corrupted checkpoint)."""
    quantized = packed.values.dtype == FP8
    expected = pattern.packed_shapes(dense_shape, name, scaled=quantized)
    for part, shape in expected.items():
        t = getattr(packed, part)
        if t is None:
            raise PatternError(f"{name}: packed {part} tensor is missing (pattern {pattern} needs it)")
        if tuple(t.shape) != shape:
            raise PatternError(
                f"{name}: packed {part} has shape {tuple(t.shape)}, expected {shape} for a dense "
                f"{tuple(dense_shape)} weight with pattern {pattern}"
            )
    if packed.values.dtype not in (*SUPPORTED_DTYPES, FP8):
        raise PatternError(f"{name}: packed values have dtype {packed.values.dtype}")
    if quantized:
        if packed.scale.dtype != torch.float32:
            raise PatternError(f"{name}: scales have dtype {packed.scale.dtype}, expected torch.float32")
        bad = ~(torch.isfinite(packed.scale) & (packed.scale > 0))
        if bool(bad.any()):
            raise PatternError(
                f"{name}: {int(bad.sum())} scales are not finite and positive (first: "
                f"{float(packed.scale[bad][0])}); the checkpoint is damaged"
            )
    elif packed.scale is not None:
        raise PatternError(f"{name}: a scale is given for unquantized {packed.values.dtype} values")
    if packed.meta.dtype != torch.int16:
        raise PatternError(f"{name}: metadata has dtype {packed.meta.dtype}, expected torch.int16")
    positions = _meta_positions(packed.meta)
    if not bool((positions[..., 0] < positions[..., 1]).all()):
        raise PatternError(f"{name}: metadata names an invalid position pair (each group of 4 needs p0 < p1)")
    if pattern.is_samoyeds and (packed.rowsel.dtype != torch.uint8 or bool((packed.rowsel > 1).any())):
        raise PatternError(f"{name}: row selectors must be uint8 values 0 or 1")
