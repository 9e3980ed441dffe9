"""The sparsity patterns, and which weight shapes can take them.

Both patterns act along the input (k) axis of a weight stored [..., m, k] (out, in), as vLLM stores expert
weights (`w13` [E, 2I, H], `w2` [E, H, I]); leading dimensions batch experts.

- ``2:4`` (50% kept): in every group of 4 consecutive inputs of a row, at most 2 are non-zero.
- ``samoyeds`` (25% kept): output rows in pairs (2i, 2i+1); in each segment of V inputs one row of the pair is
  kept and the other is zero there; inside the kept row, 2:4.

`Pattern` is the one representation everywhere: the CLI, checkpoint configs, the vLLM method and the custom op
carry its two fields (`name`, `segment`), and only the kernels layer turns it into template arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import PatternError

PATTERNS = ("2:4", "samoyeds")
SEGMENTS = (32, 64, 128)
DEFAULT_SEGMENT = 128
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

GROUP = 4  # a 2:4 group: 2 of every 4 consecutive inputs are kept
META_SPAN = 16  # inputs described by one int16 of metadata (4 groups)
K_STEP = 32  # one sparse tensor-core k-step: the 2:4 format's input granularity


@dataclass(frozen=True)
class Pattern:
    """A sparsity pattern: `name` is "2:4" or "samoyeds"; `segment` (V) is set for samoyeds only."""

    name: str
    segment: int | None = None

    @classmethod
    def parse(cls, name: str, segment: int | None = None) -> Pattern:
        if name not in PATTERNS:
            raise PatternError(f"unknown sparsity pattern {name!r}; choose one of {', '.join(PATTERNS)}")
        if name == "2:4":
            if segment is not None:
                raise PatternError("a segment size only applies to the samoyeds pattern, not 2:4")
            return cls(name)
        segment = DEFAULT_SEGMENT if segment is None else int(segment)
        if segment not in SEGMENTS:
            raise PatternError(f"samoyeds segment must be one of {SEGMENTS}, got {segment}")
        return cls(name, segment)

    def __str__(self) -> str:
        return self.name if self.segment is None else f"{self.name}(V={self.segment})"

    @property
    def is_samoyeds(self) -> bool:
        return self.name == "samoyeds"

    @property
    def density(self) -> float:
        """Fraction of weights kept."""
        return 0.25 if self.is_samoyeds else 0.5

    def check_shape(self, shape: tuple[int, ...] | torch.Size, name: str = "weight") -> None:
        """Raise PatternError naming the tensor and the rule if a [..., out, in] shape cannot take the pattern."""
        shape = tuple(shape)
        if len(shape) < 2:
            raise PatternError(f"{name}: shape {shape} is not a matrix [out, in] (or [experts, out, in])")
        m, k = shape[-2:]
        if self.is_samoyeds:
            if m % 2:
                raise PatternError(
                    f"{name}: shape {shape} does not fit {self}: out_features {m} is odd, but rows are kept in pairs"
                )
            if k % self.segment:
                raise PatternError(
                    f"{name}: shape {shape} does not fit {self}: in_features {k} is not a multiple of the segment "
                    f"size {self.segment}"
                )
        elif k % K_STEP:
            raise PatternError(
                f"{name}: shape {shape} does not fit {self}: in_features {k} is not a multiple of {K_STEP} (one "
                "sparse tensor-core step)"
            )

    def packed_shapes(
        self, shape: tuple[int, ...] | torch.Size, name: str = "weight", scaled: bool = False
    ) -> dict[str, tuple]:
        """Shapes of the packed tensors ("values", "meta", "rowsel" for samoyeds, "scale" for quantized values: one
        per output row) for a dense shape."""
        self.check_shape(shape, name)
        *lead, m, k = tuple(shape)
        rows = m // 2 if self.is_samoyeds else m
        shapes = {"values": (*lead, rows, k // 2), "meta": (*lead, rows, k // META_SPAN)}
        if self.is_samoyeds:
            shapes["rowsel"] = (*lead, m // 2, k // self.segment)
        if scaled:
            shapes["scale"] = (*lead, m)
        return shapes

    def packed_bytes(self, shape: tuple[int, ...] | torch.Size, value_bytes: int, scaled: bool = False) -> int:
        """Bytes of the packed tensors of a dense shape: values of `value_bytes` each, int16 metadata, uint8 row
        selectors, fp32 scales (format/packing.py)."""
        sizes = {"values": value_bytes, "meta": 2, "rowsel": 1, "scale": 4}
        return sum(math.prod(s) * sizes[part] for part, s in self.packed_shapes(shape, scaled=scaled).items())

    def to_config(self) -> dict:
        """The checkpoint config keys that name this pattern (format.checkpoint reads them back)."""
        return {"pattern": self.name, "segment": self.segment}
