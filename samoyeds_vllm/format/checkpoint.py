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

Version 2 stores the kept values in float8 e4m3 with one fp32 scale per output row of the dense weight, and says
so in two more keys, `"values": "float8_e4m3fn", "scale": "channel"`; version 1 (values in the model's dtype)
still loads, and converters write it for unquantized values so older readers keep reading those.

Version 3 is a checkpoint converted from an FP8 block-quantized one (Qwen3-*-FP8, DeepSeek-V3) that keeps the
layers besides the routed experts as they were: `"other_layers"` holds that checkpoint's quantization_config
(`"quant_method": "fp8"`, `weight_block_size`, modules_to_not_convert), whose FP8 weights and `weight_scale_inv`
blocks (format/fp8_blocks.py) the checkpoint stores unchanged; the values are quantized or not as in versions 1-2.
A reader of versions 1-2 would load those FP8 weights as plain ones, so they get a version of their own.

A weight `X.weight` is stored as `X.weight_packed`, `X.weight_meta`, (samoyeds) `X.weight_rowsel` and (quantized
values, versions 2-3) `X.weight_scale`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CheckpointError, PatternError
from .fp8_blocks import block_size
from .pattern import Pattern

QUANT_METHOD = "samoyeds"
FORMAT_VERSION = 3  # the newest this package reads and writes
FORMAT_VERSIONS = (1, 2, 3)
#: Where a Hugging Face config counts a MoE model's routed experts: Mixtral and Llama-4; Qwen-MoE and OLMoE;
#: DeepSeek, Kimi-K2 and GLM-4.5. A config with none of them has no experts to make sparse.
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
#: Checkpoint suffixes replacing `weight` for each packed tensor (fields of packing.PackedWeight).
SUFFIXES = {"values": "weight_packed", "meta": "weight_meta", "rowsel": "weight_rowsel", "scale": "weight_scale"}
#: Value types a checkpoint may name (`values`), and the one scale layout (`scale`): one fp32 per output row.
VALUE_TYPES = {"float8_e4m3fn": torch.float8_e4m3fn}
SCALE_LAYOUT = "channel"
#: Every key of a samoyeds quantization_config (quantization_config below writes them); any other is a misspelling
#: that would otherwise leave its setting at the default unnoticed ("patern": "2:4" served the samoyeds pattern).
CONFIG_KEYS = frozenset(
    {"quant_method", "format_version", "pattern", "segment", "values", "scale", "other_layers", "sparse_modules"}
    | {"pruning_method", "recovery"}  # informative: how the kept weights were chosen (convert, recover)
)


def quantization_config(
    pattern: Pattern,
    sparse_modules: list[str],
    pruning_method: str,
    values: torch.dtype | None = None,
    other_layers: dict | None = None,
) -> dict:
    """The `quantization_config` entry of a packed checkpoint's config.json; `values` the stored value type when
    quantized (version 2), None for values in the model's dtype (version 1); `other_layers` the FP8 block config
    the other layers keep (version 3)."""
    quantized = {}
    if values is not None:
        names = {dtype: name for name, dtype in VALUE_TYPES.items()}
        quantized = {"values": names[values], "scale": SCALE_LAYOUT}
    return {
        "quant_method": QUANT_METHOD,
        "format_version": 3 if other_layers else 2 if quantized else 1,
        **pattern.to_config(),
        **quantized,
        **({"other_layers": dict(other_layers)} if other_layers else {}),
        "sparse_modules": list(sparse_modules),
        "pruning_method": pruning_method,
    }


@dataclass(frozen=True)
class SparseCheckpointConfig:
    """A parsed `quantization_config`: the pattern, whether the expert weights are stored packed, the stored
    value type (None: the model's dtype; else scaled values of that type), and the FP8 block config of the other
    layers (None: they are in the model's dtype)."""

    pattern: Pattern
    packed: bool
    sparse_modules: tuple[str, ...] = ()
    values: torch.dtype | None = None
    other_layers: dict | None = None


def parse_quantization_config(config: dict) -> SparseCheckpointConfig:
    """Read a `quantization_config` dict (or the empty one of `--quantization samoyeds` on a dense checkpoint).
    A `format_version` means packed tensors; this package reads FORMAT_VERSIONS. CheckpointError otherwise."""
    # beside an FP8 checkpoint's own keys (sparsify on load) the samoyeds ones cannot be told from them
    if config.get("quant_method", QUANT_METHOD) == QUANT_METHOD and (unknown := sorted(set(config) - CONFIG_KEYS)):
        keys = ", ".join(map(repr, unknown))
        raise CheckpointError(
            f"samoyeds quantization_config: unknown key{'s' if len(unknown) > 1 else ''} {keys} (it takes "
            f"{', '.join(sorted(CONFIG_KEYS))})"
        )
    segment = config.get("segment")
    if segment is not None and (not isinstance(segment, int) or isinstance(segment, bool)):
        raise CheckpointError(f"samoyeds quantization_config: segment wants a number, not {segment!r}")
    version = config.get("format_version")
    if version is not None and version not in FORMAT_VERSIONS:
        raise CheckpointError(
            f"samoyeds checkpoint format_version {version!r} is not supported by this samoyeds-vllm (it reads "
            f"versions {', '.join(map(str, FORMAT_VERSIONS))}); re-convert the model or upgrade"
        )
    try:
        pattern = Pattern.parse(config.get("pattern", "samoyeds"), segment)
    except PatternError as e:
        raise CheckpointError(f"samoyeds quantization_config: {e}") from None
    # Quantized values: named by version 2 (or 3), or asked of sparsify on load (no version) with the same keys.
    name, layout = config.get("values"), config.get("scale", SCALE_LAYOUT if version is None else None)
    values = None
    if version == 2 or (version in (None, 3) and name is not None):
        if name not in VALUE_TYPES or layout != SCALE_LAYOUT:
            raise CheckpointError(
                f"samoyeds quantization_config: quantized values need values one of {', '.join(VALUE_TYPES)} and "
                f"scale {SCALE_LAYOUT!r}, not values {name!r} and scale {layout!r}"
            )
        values = VALUE_TYPES[name]
    elif version == 1 and name is not None:
        raise CheckpointError(
            "samoyeds quantization_config: format_version 1 stores unquantized values; "
            f"values {name!r} needs format_version 2"
        )
    other_layers = config.get("other_layers")
    if version == 3:
        try:
            block = block_size(other_layers)
        except CheckpointError as e:
            raise CheckpointError(f"samoyeds quantization_config: other_layers: {e}") from None
        if block is None:
            raise CheckpointError(
                "samoyeds quantization_config: format_version 3 needs other_layers, the FP8 block config "
                '("quant_method": "fp8" with weight_block_size) of the layers besides the experts, '
                f"not {other_layers!r}"
            )
    elif other_layers is not None:
        raise CheckpointError(
            f"samoyeds quantization_config: other_layers (FP8 layers besides the experts) needs format_version 3, "
            f"not {version!r}"
        )
    return SparseCheckpointConfig(
        pattern, version is not None, tuple(config.get("sparse_modules") or ()), values, other_layers
    )
