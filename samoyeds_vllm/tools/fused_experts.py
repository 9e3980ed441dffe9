"""Checkpoints whose experts are fused into 3-D tensors (Llama-4), seen as one tensor per expert and projection.

The converter, calibration and pruning work on per-expert weights, and sparse checkpoints store them so (vLLM's
Llama-4 loader maps per-expert names onto its fused-MoE layer); only the dense export goes back to the hub's fused
layout, which transformers needs.
"""

from __future__ import annotations

from collections import Counter

import torch

from ..errors import CheckpointError
from .architectures import Architecture


def per_expert(reader, arch: Architecture):
    """`reader` as the tools read every checkpoint: one [out, in] weight per expert and projection (a
    PerExpertReader over a fused-experts checkpoint, the reader itself otherwise)."""
    return PerExpertReader(reader, arch) if arch.fused_experts else reader


class PerExpertReader:
    """A reader's view of a fused-experts checkpoint: each fused tensor is replaced, in place in the name order,
    by the per-expert [out, in] weights it holds; every other tensor passes unchanged. The fused tensor last
    split is kept, so reading its experts in a row reads it once."""

    def __init__(self, reader, arch: Architecture):
        self.reader, self.arch = reader, arch
        self.model_dir = reader.model_dir
        self._names: list[str] = []
        self.fused_of: dict[str, str] = {}  # per-expert name -> the fused tensor holding it
        self._shapes: dict[str, tuple[int, ...]] = {}
        for name in reader.names():
            if not arch.fused_expert_re.match(name):
                self._names.append(name)
                continue
            shape = reader.shape(name)
            roles = arch.fused_roles(arch.fused_expert_re.match(name)["fused"])
            if len(shape) != 3 or shape[2] % len(roles):
                raise CheckpointError(
                    f"{self.model_dir}: fused expert tensor {name} has shape {shape}, expected [experts, in, out]"
                    + (" with gate and up side by side on the last axis" if len(roles) == 2 else "")
                )
            layer = int(arch.fused_expert_re.match(name)["layer"])
            for expert in range(shape[0]):
                for role in roles:
                    per_expert = arch.expert_weight_name(layer, expert, arch.projection(role))
                    self._names.append(per_expert)
                    self.fused_of[per_expert] = name
                    self._shapes[per_expert] = (shape[2] // len(roles), shape[1])
        self._split: tuple[str, dict[str, torch.Tensor]] | None = None

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name] if name in self._shapes else self.reader.shape(name)

    def itemsize(self, name: str) -> int:
        return self.reader.itemsize(self.fused_of.get(name, name))

    def get(self, name: str) -> torch.Tensor:
        fused = self.fused_of.get(name)
        if fused is None:
            return self.reader.get(name)
        if self._split is None or self._split[0] != fused:
            self._split = fused, self.arch.split_fused(fused, self.reader.get(fused))
        return self._split[1][name].contiguous()


class FusingWriter:
    """Writes per-expert weights of a fused-experts checkpoint back as the fused tensors its reader split, each
    once all its experts arrived; every other tensor goes straight to `writer`."""

    def __init__(self, writer, reader: PerExpertReader):
        self.writer, self.reader = writer, reader
        self._parts = Counter(reader.fused_of.values())  # fused tensor -> per-expert weights it holds
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        fused = self.reader.fused_of.get(name)
        if fused is None:
            self.writer.add(name, tensor)
            return
        parts = self._pending.setdefault(fused, {})
        parts[name] = tensor
        if len(parts) == self._parts[fused]:
            self.writer.add(fused, self.reader.arch.fuse(fused, self._pending.pop(fused)))

    def close(self) -> None:
        if self._pending:  # a bug, not bad input: every expert of a fused tensor is written
            raise RuntimeError(f"fused expert tensors left incomplete: {', '.join(sorted(self._pending))}")
        self.writer.close()
