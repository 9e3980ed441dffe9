"""Block-quantized FP8 weights (DeepSeek-V3, Qwen3-*-FP8 checkpoints): what such a checkpoint stores and the
weights it stands for. Read by the converter (tools/fp8_blocks.py) and by sparsify on load (the plugin), so both
prune the same dequantized experts.

Such a checkpoint says `"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], ...}` and
stores each quantized weight `X.weight` [m, k] as float8_e4m3fn next to `X.weight_scale_inv`
[ceil(m / 128), ceil(k / 128)] float32: the weight is X.weight * scale_inv of its block.
"""

from __future__ import annotations

import math

import torch

from ..errors import CheckpointError

SCALE_SUFFIX = "_scale_inv"
BLOCK = (128, 128)


def block_size(quant: dict | None) -> tuple[int, int] | None:
    """The block of an FP8 block-quantized checkpoint's quantization_config, None for any other config."""
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8" or not quant.get("weight_block_size"):
        return None
    block = quant["weight_block_size"]
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise CheckpointError(f"fp8 quantization_config: weight_block_size {block!r} is not two positive integers")
    return block[0], block[1]


def scale_shape(shape: tuple[int, ...], block: tuple[int, int] = BLOCK) -> tuple[int, ...]:
    """The scale_inv shape of a [..., M, K] weight: one per block, partial blocks at the edges included."""
    *lead, m, k = shape
    return (*lead, -(-m // block[0]), -(-k // block[1]))


def quantized_bytes(shape: tuple[int, ...], block: tuple[int, int] = BLOCK) -> int:
    """Bytes of a block-quantized weight of `shape`: one e4m3 byte a value and one fp32 scale a block."""
    return math.prod(shape) + 4 * math.prod(scale_shape(shape, block))


def dequantize_blocks(
    q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = BLOCK, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The weights [..., M, K] a block-quantized tensor stands for. float32 gives q * scale exactly; a 16-bit dtype
    rounds the scale and the product to it (as Marlin's FP8 kernel multiplies in the activations' dtype)."""
    expected = scale_shape(q.shape, block)
    if tuple(scale_inv.shape) != expected:
        raise CheckpointError(f"scale_inv has shape {tuple(scale_inv.shape)}, expected {expected} for {tuple(q.shape)}")
    m, k = q.shape[-2:]
    full = scale_inv.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)[..., :m, :k]
    return q.to(dtype) * full.to(dtype)
