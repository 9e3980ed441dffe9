"""The sparse format: patterns, the packed layout, and the checkpoint keys that describe them.

The bottom layer: the vLLM plugin, the kernels' host code, the offline tools and the benchmarks all import it, and
it imports nothing of theirs.
"""

from .checkpoint import (
    FORMAT_VERSION,
    QUANT_METHOD,
    SUFFIXES,
    SparseCheckpointConfig,
    parse_quantization_config,
    quantization_config,
)
from .packing import PackedWeight, check, check_packed, compress, decompress, prune, prune_mask, satisfies
from .pattern import DEFAULT_SEGMENT, PATTERNS, SEGMENTS, SUPPORTED_DTYPES, Pattern

__all__ = [
    "DEFAULT_SEGMENT",
    "FORMAT_VERSION",
    "PATTERNS",
    "QUANT_METHOD",
    "SEGMENTS",
    "SUFFIXES",
    "SUPPORTED_DTYPES",
    "PackedWeight",
    "Pattern",
    "SparseCheckpointConfig",
    "check",
    "check_packed",
    "compress",
    "decompress",
    "parse_quantization_config",
    "prune",
    "prune_mask",
    "quantization_config",
    "satisfies",
]
