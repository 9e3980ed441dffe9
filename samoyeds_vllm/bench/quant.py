"""Weight formats of the peers `bench moe --peers` times, in plain torch (so they run, and are tested, on CPU).

- FP8 block: float8_e4m3fn values with one fp32 scale per 128 x 128 block (tools/fp8_blocks.py, which also reads
  and writes such checkpoints): the `weight_scale_inv` of DeepSeek-V3 and Qwen3-FP8, which vLLM's FP8 MoE reads as is.
- 4-bit GPTQ rows: integers 0..15 (value + 8) packed along K, 8 per int32, row 8j+i in bits 4i..4i+3 (GPTQ's
  qweight, vLLM's `pack_rows`), the input of vLLM's Marlin repack; the scales stay [K / group, N].

Expert weights are [E, out, in] (vLLM's w13 [E, 2I, H] and w2 [E, H, I]); GPTQ tensors are [in, out] per expert.
"""

from __future__ import annotations

import torch

INT4_BIAS = 8  # uint4b8: stored value = integer + 8


def pack_int4_rows(q: torch.Tensor) -> torch.Tensor:
    """Integers 0..15 [..., K, N] -> int32 [..., K/8, N], GPTQ's qweight layout (vLLM's `pack_rows`)."""
    *lead, k, n = q.shape
    if k % 8:
        raise ValueError(f"K = {k} is not a multiple of 8")
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64).view(8, 1)
    packed = (q.to(torch.int64).reshape(*lead, k // 8, 8, n) << shifts).sum(dim=-2)  # < 2**32
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., K/8, N] -> integers 0..15 [..., K, N] (int32), the inverse of `pack_int4_rows`."""
    *lead, k8, n = packed.shape
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int64).view(8, 1)
    values = (packed.to(torch.int64).unsqueeze(-2) >> shifts) & 0xF
    return values.reshape(*lead, k8 * 8, n).to(torch.int32)


def dequantize_int4_rows(packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The [..., K, N] weights of GPTQ-packed uint4b8 integers and their [..., K / group, N] scales, in the scales'
    dtype: (q - 8) * scale rounded to it, as vLLM's `quantize_weights` forms its reference and Marlin its weights."""
    q = unpack_int4_rows(packed) - INT4_BIAS
    return q.to(scales.dtype) * scales.repeat_interleave(group_size, dim=-2)


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
