"""Block-quantized FP8 checkpoints (DeepSeek-V3, Qwen3-*-FP8): the input side of conversion.

Such a checkpoint says `"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], ...}` and
stores each quantized weight `X.weight` [m, k] as float8_e4m3fn next to `X.weight_scale_inv`
[ceil(m / 128), ceil(k / 128)] float32: the weight is X.weight * scale_inv of its block. The converter reads them
dequantized (`Fp8BlockReader`) and prunes and packs as from a dense checkpoint; `quantize_blocks` writes them
(make-model --fp8-block), so tests have such checkpoints without downloads.
"""

from __future__ import annotations

import torch

from ..errors import CheckpointError
from ..format import FP8, FP8_MAX

SCALE_SUFFIX = "_scale_inv"
BLOCK = (128, 128)


def fp8_block_config(not_converted: list[str]) -> dict:
    """The quantization_config of a checkpoint quantized like Qwen3-*-FP8 (dynamic activations, 128 x 128 blocks)."""
    return {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": list(BLOCK),
        "modules_to_not_convert": not_converted,
    }


def block_size(quant: dict) -> tuple[int, int] | None:
    """The block of an FP8 block-quantized checkpoint's quantization_config, None for any other config."""
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8" or not quant.get("weight_block_size"):
        return None
    block = quant["weight_block_size"]
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise CheckpointError(f"fp8 quantization_config: weight_block_size {block!r} is not two positive integers")
    return block[0], block[1]


def _expand(scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    return scale.repeat_interleave(block[0], 0)[: shape[0]].repeat_interleave(block[1], 1)[:, : shape[1]]


def quantize_blocks(w: torch.Tensor, block: tuple[int, int] = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, float32 scale_inv per block) of a 2-D weight: each block's largest magnitude maps to FP8_MAX."""
    m, k = w.shape
    rows, cols = -(-m // block[0]), -(-k // block[1])
    padded = torch.zeros(rows * block[0], cols * block[1], dtype=torch.float32)
    padded[:m, :k] = w.float()
    blocks = padded.reshape(rows, block[0], cols, block[1])
    amax = blocks.abs().amax(dim=(1, 3))
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones(()))
    q = (w.float() / _expand(scale_inv, (m, k), block)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale_inv


def dequantize_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype):
    """The weight a block-quantized tensor stands for, in `dtype`."""
    m, k = q.shape
    expected = (-(-m // block[0]), -(-k // block[1]))
    if tuple(scale_inv.shape) != expected:
        raise CheckpointError(f"scale_inv has shape {tuple(scale_inv.shape)}, expected {expected} for {tuple(q.shape)}")
    return (q.float() * _expand(scale_inv.float(), (m, k), block)).to(dtype)


class Fp8BlockReader:
    """A CheckpointReader's view of a block-quantized checkpoint as the dense one it stands for: FP8 weights come
    dequantized to `dtype`, their scale_inv tensors are hidden, every other tensor passes unchanged."""

    def __init__(self, reader, block: tuple[int, int], dtype: torch.dtype):
        self.reader, self.block, self.dtype = reader, block, dtype
        self.model_dir = reader.model_dir
        names = reader.names()
        self._present = set(names)
        self._names = [
            n for n in names if not (n.endswith(SCALE_SUFFIX) and n.removesuffix(SCALE_SUFFIX) in self._present)
        ]

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.reader.shape(name)

    def get(self, name: str) -> torch.Tensor:
        tensor = self.reader.get(name)
        if tensor.dtype != FP8:
            return tensor
        scale_name = name + SCALE_SUFFIX
        if scale_name not in self._present:
            raise CheckpointError(f"{self.model_dir}: FP8 tensor {name} has no {scale_name}")
        try:
            return dequantize_blocks(tensor, self.reader.get(scale_name), self.block, self.dtype)
        except CheckpointError as e:
            raise CheckpointError(f"{self.model_dir}: {name}: {e}") from None
