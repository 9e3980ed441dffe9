"""The sparse format: patterns, the packed layout, and the checkpoint keys that describe them.

The bottom layer: the vLLM plugin, the kernels' host code, the offline tools and the benchmarks all import it, and
it imports nothing of theirs.
"""

from .checkpoint import (
    EXPERT_COUNT_KEYS,
    FORMAT_VERSION,
    FORMAT_VERSIONS,
    QUANT_METHOD,
    SUFFIXES,
    VALUE_TYPES,
    SparseCheckpointConfig,
    parse_quantization_config,
    quantization_config,
)
from .packing import (
    FP8,
    FP8_MAX,
    PackedWeight,
    check,
    check_packed,
    compress,
    decompress,
    nonfinite_count,
    prune,
    prune_mask,
    quantize,
    satisfies,
    value_scales,
)
from .pattern import DEFAULT_SEGMENT, PATTERNS, SEGMENTS, SUPPORTED_DTYPES, Pattern

__all__ = [
    "DEFAULT_SEGMENT",
    "EXPERT_COUNT_KEYS",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "FP8",
    "FP8_MAX",
    "PATTERNS",
    "QUANT_METHOD",
    "SEGMENTS",
    "SUFFIXES",
    "SUPPORTED_DTYPES",
    "VALUE_TYPES",
    "PackedWeight",
    "Pattern",
    "SparseCheckpointConfig",
    "check",
    "check_packed",
    "compress",
    "decompress",
    "nonfinite_count",
    "parse_quantization_config",
    "prune",
    "prune_mask",
    "quantization_config",
    "quantize",
    "satisfies",
    "value_scales",
]
