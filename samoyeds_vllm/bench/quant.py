"""Weight formats of the peers `bench moe --peers` times, in plain torch (so they run, and are tested, on CPU).

- FP8 block: float8_e4m3fn values with one fp32 scale per 128 x 128 block, `w ~= q * scale`, scale = block amax /
  448: the `weight_scale_inv` of DeepSeek-V3 and Qwen3-FP8 checkpoints, which vLLM's FP8 MoE reads as is.
- 4-bit GPTQ rows: integers 0..15 (value + 8) packed along K, 8 per int32, row 8j+i in bits 4i..4i+3 (GPTQ's
  qweight, vLLM's `pack_rows`), the input of vLLM's Marlin repack; the scales stay [K / group, N].

Expert weights are [E, out, in] (vLLM's w13 [E, 2I, H] and w2 [E, H, I]); GPTQ tensors are [in, out] per expert.
"""

from __future__ import annotations

import torch

FP8_BLOCK = (128, 128)  # (out, in) elements per scale
FP8_DTYPE = torch.float8_e4m3fn
INT4_BIAS = 8  # uint4b8: stored value = integer + 8


def fp8_scale_shape(shape: tuple[int, ...], block: tuple[int, int] = FP8_BLOCK) -> tuple[int, ...]:
    *lead, m, k = shape
    return (*lead, -(-m // block[0]), -(-k // block[1]))


def quantize_fp8_block(
    w: torch.Tensor, block: tuple[int, int] = FP8_BLOCK, chunk_elements: int = 1 << 28
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., M, K] -> (q float8_e4m3fn [..., M, K], scale float32 [..., ceil(M/128), ceil(K/128)]).

    A few matrices at a time (fp32 temporaries of ~`chunk_elements`), so DeepSeek-V3's 15 GB of gate/up weights
    quantize next to the weights themselves. Blocks past the edge of M or K are padded with zeros."""
    *lead, m, k = w.shape
    fp8_max = torch.finfo(FP8_DTYPE).max
    flat = w.reshape(-1, m, k)
    q = torch.empty(flat.shape, dtype=FP8_DTYPE, device=w.device)
    scale = torch.empty(fp8_scale_shape(flat.shape, block), dtype=torch.float32, device=w.device)
    bm, bk = block
    mb, kb = scale.shape[-2:]
    step = max(1, chunk_elements // (m * k))
    for start in range(0, flat.shape[0], step):
        part = flat[start : start + step].float()
        padded = torch.nn.functional.pad(part, (0, kb * bk - k, 0, mb * bm - m))
        blocks = padded.reshape(-1, mb, bm, kb, bk)
        amax = blocks.abs().amax(dim=(2, 4))
        s = torch.where(amax > 0, amax / fp8_max, torch.ones_like(amax))
        scaled = (blocks / s[:, :, None, :, None]).clamp_(-fp8_max, fp8_max)
        q[start : start + step] = scaled.reshape(padded.shape)[:, :m, :k].to(FP8_DTYPE)
        scale[start : start + step] = s
    return q.reshape(w.shape), scale.reshape(*lead, mb, kb)


def dequantize_fp8_block(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = FP8_BLOCK, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The weights `q` and `scale` stand for, [..., M, K]. dtype float32 gives q * scale exactly; a 16-bit dtype
    rounds the scale and the product to it, as Marlin's FP8 kernel does (it multiplies in the activations' dtype)."""
    m, k = q.shape[-2:]
    full = scale.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)[..., :m, :k]
    return q.to(dtype) * full.to(dtype)


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
