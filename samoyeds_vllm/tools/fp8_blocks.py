"""Block-quantized FP8 checkpoints (DeepSeek-V3, Qwen3-*-FP8; format/fp8_blocks.py describes them): the input side
of conversion. The converter reads their experts dequantized (`Fp8BlockReader.get`) and prunes and packs them as
from a dense checkpoint, and copies their other FP8 weights as stored (`Fp8BlockReader.stored`; or dequantized, when
asked); `quantize_blocks` writes such checkpoints (make-model --fp8-block), so tests have them without downloads.
"""

from __future__ import annotations

import math

import torch

from ..errors import CheckpointError
from ..format import FP8, FP8_MAX
from ..format.fp8_blocks import BLOCK, SCALE_SUFFIX, block_size, dequantize_blocks, scale_shape


def fp8_block_config(not_converted: list[str]) -> dict:
    """The quantization_config of a checkpoint quantized like Qwen3-*-FP8 (dynamic activations, 128 x 128 blocks)."""
    return {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": list(BLOCK),
        "modules_to_not_convert": not_converted,
    }


def quantize_blocks(
    w: torch.Tensor, block: tuple[int, int] = BLOCK, chunk_elements: int = 1 << 28
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., M, K] -> (float8 q [..., M, K], float32 scale_inv [..., ceil(M / 128), ceil(K / 128)]): each block's
    largest magnitude maps to FP8_MAX (blocks of zeros get scale 1). A few matrices at a time (fp32 temporaries of
    ~`chunk_elements`), so DeepSeek-V3's 15 GB of gate/up weights quantize next to the weights themselves."""
    *lead, m, k = w.shape
    flat = w.reshape(-1, m, k)
    q = torch.empty(flat.shape, dtype=FP8, device=w.device)
    scale = torch.empty(scale_shape(flat.shape, block), dtype=torch.float32, device=w.device)
    bm, bk = block
    mb, kb = scale.shape[-2:]
    step = max(1, chunk_elements // (m * k))
    for start in range(0, flat.shape[0], step):
        part = flat[start : start + step].float()
        padded = torch.nn.functional.pad(part, (0, kb * bk - k, 0, mb * bm - m))
        blocks = padded.reshape(-1, mb, bm, kb, bk)
        amax = blocks.abs().amax(dim=(2, 4))
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        scaled = (blocks / s[:, :, None, :, None]).clamp_(-FP8_MAX, FP8_MAX)
        q[start : start + step] = scaled.reshape(padded.shape)[:, :m, :k].to(FP8)
        scale[start : start + step] = s
    return q.reshape(w.shape), scale.reshape(*lead, mb, kb)


class Fp8BlockReader:
    """A CheckpointReader's view of a block-quantized checkpoint (its `quantization_config`) as the dense one it
    stands for: FP8 weights come dequantized to `dtype`, their scale_inv tensors are hidden, every other tensor
    passes unchanged. `stored` gives a tensor as the checkpoint holds it, `dense` turns that into what `get` gives."""

    def __init__(self, reader, quantization_config: dict, dtype: torch.dtype):
        self.reader, self.quantization_config, self.dtype = reader, quantization_config, dtype
        self.block = block_size(quantization_config)
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

    def itemsize(self, name: str) -> int:
        """Bytes of one value of `name` as `get` gives it (FP8 weights dequantized to the model's dtype)."""
        return self.dtype.itemsize if self._quantized(name) else self.reader.itemsize(name)

    def stored_bytes(self, name: str) -> int:
        """Bytes of `name` as the checkpoint stores it: an FP8 weight with its scale_inv, any other tensor alone."""
        scale = name + SCALE_SUFFIX
        extra = self.reader.itemsize(scale) * math.prod(self.shape(scale)) if self._quantized(name) else 0
        return self.reader.itemsize(name) * math.prod(self.shape(name)) + extra

    def _quantized(self, name: str) -> bool:
        return name + SCALE_SUFFIX in self._present and self.reader.itemsize(name) == 1

    def stored(self, name: str) -> dict[str, torch.Tensor]:
        """A tensor as the checkpoint stores it: an FP8 weight with its scale_inv, any other tensor alone."""
        tensor = self.reader.get(name)
        if tensor.dtype != FP8:
            return {name: tensor}
        scale_name = name + SCALE_SUFFIX
        if scale_name not in self._present:
            raise CheckpointError(f"{self.model_dir}: FP8 tensor {name} has no {scale_name}")
        return {name: tensor, scale_name: self.reader.get(scale_name)}

    def dense(self, name: str, stored: dict[str, torch.Tensor]) -> torch.Tensor:
        """The tensor `name` that `stored(name)` holds, dequantized if FP8."""
        tensor = stored[name]
        if tensor.dtype != FP8:
            return tensor
        scale = stored[name + SCALE_SUFFIX].float()
        try:
            return dequantize_blocks(tensor, scale, self.block, torch.float32).to(self.dtype)
        except CheckpointError as e:
            raise CheckpointError(f"{self.model_dir}: {name}: {e}") from None

    def get(self, name: str) -> torch.Tensor:
        return self.dense(name, self.stored(name))
