"""What a samoyeds checkpoint says about itself: the `quantization_config` keys of its config.json and the names
of its packed tensors. The converter and the model maker write these, the vLLM method reads them; nothing else
spells them out.

    "quantization_config": {
        "quant_method": "samoyeds",            vLLM picks the method by this name
        "format_version": 1,                   present: packed tensors; absent: dense weights, sparsified on load
        "pattern": "samoyeds", "segment": 128, Pattern.to_config()
        "sparse_modules": [...],               globs over checkpoint tensor names (informative)
        "pruning_method": "magnitude"          how the kept weights were chosen (informative)
    }

A weight `X.weight` is stored as `X.weight_packed`, `X.weight_meta` and (samoyeds) `X.weight_rowsel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CheckpointError, PatternError
from .pattern import Pattern

QUANT_METHOD = "samoyeds"
FORMAT_VERSION = 1
#: Checkpoint suffixes replacing `weight` for each packed tensor (fields of packing.PackedWeight).
SUFFIXES = {"values": "weight_packed", "meta": "weight_meta", "rowsel": "weight_rowsel"}


def quantization_config(pattern: Pattern, sparse_modules: list[str], pruning_method: str) -> dict:
    """The `quantization_config` entry of a packed checkpoint's config.json."""
    return {
        "quant_method": QUANT_METHOD,
        "format_version": FORMAT_VERSION,
        **pattern.to_config(),
        "sparse_modules": list(sparse_modules),
        "pruning_method": pruning_method,
    }


@dataclass(frozen=True)
class SparseCheckpointConfig:
    """A parsed `quantization_config`: the pattern, and whether the expert weights are stored packed."""

    pattern: Pattern
    packed: bool
    sparse_modules: tuple[str, ...] = ()


def parse_quantization_config(config: dict) -> SparseCheckpointConfig:
    """Read a `quantization_config` dict (or the empty one of `--quantization samoyeds` on a dense checkpoint).
    A `format_version` means packed tensors; this package reads FORMAT_VERSION only. CheckpointError otherwise."""
    version = config.get("format_version")
    if version is not None and version != FORMAT_VERSION:
        raise CheckpointError(
            f"samoyeds checkpoint format_version {version!r} is not supported by this samoyeds-vllm (it reads "
            f"version {FORMAT_VERSION}); re-convert the model or upgrade"
        )
    try:
        pattern = Pattern.parse(config.get("pattern", "samoyeds"), config.get("segment"))
    except PatternError as e:
        raise CheckpointError(f"samoyeds quantization_config: {e}") from None
    return SparseCheckpointConfig(pattern, version is not None, tuple(config.get("sparse_modules") or ()))
