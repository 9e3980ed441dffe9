"""The `samoyeds` quantization config vLLM builds from a checkpoint (or from `--quantization samoyeds`).

Only the routed experts are sparse; router gates, attention and shared experts stay dense (vLLM's unquantized
methods). Two ways in:
- a checkpoint made by `samoyeds-vllm convert` (config.json names the method, the packed tensors are loaded);
- a dense checkpoint (or load_format="dummy") with `--quantization samoyeds`: weights load dense and are pruned
  and packed after loading ("sparsify on load"; pattern samoyeds V=128 with values in the model's dtype unless
  `--hf-overrides '{"quantization_config": {"quant_method": "samoyeds", "pattern": "2:4"}}'` says otherwise,
  `"values": "float8_e4m3fn"` for FP8 values);
- an FP8 block-quantized checkpoint (Qwen3-*-FP8: `"quant_method": "fp8"` with `weight_block_size`) with
  `--quantization samoyeds`: its experts are dequantized with their block scales, then pruned and packed as above;
  every other layer keeps its FP8 weights through vLLM's own Fp8Config (its FP8 block GEMMs). The same samoyeds
  keys added to the checkpoint's quantization_config through --hf-overrides choose the pattern and values. A
  checkpoint converted from such a one (format version 3) names that FP8 config in `other_layers`, and its other
  layers load the same way.

vLLM pickles the config to its engine processes, so the class lives at module level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

from ..errors import CheckpointError
from ..format import EXPERT_COUNT_KEYS, QUANT_METHOD, SUFFIXES, Pattern, parse_quantization_config
from ..format.fp8_blocks import SCALE_SUFFIX, block_size
from ..format.shards import open_shard, shard_files
from .moe_method import SamoyedsMoEMethod

#: One expert's tensor: LAYER.E.PROJECTION.SUFFIX, where vLLM names the experts layer LAYER too (every supported
#: family: `model.layers.3.mlp.experts.5.gate_proj.weight_packed`, `...block_sparse_moe.experts.5.w1.weight`,
#: multimodal Llama-4's `language_model.model.layers.3.feed_forward.experts.5.down_proj.weight_packed`).
_EXPERT_TENSOR = re.compile(r"^(?P<layer>.+\.experts)\.(?P<expert>\d+)\.(?P<projection>[^.]+)\.(?P<suffix>[^.]+)$")
#: The down projections' names ([hidden, intermediate]); the others (gate, up) are [intermediate, hidden].
_DOWN_PROJECTIONS = ("down_proj", "w2")


@dataclass
class CheckpointExperts:
    """What one experts layer's tensors in the checkpoint are: the highest expert id (and a tensor of it), and
    the first tensor of a kind this checkpoint should not hold, if any."""

    highest: int
    highest_name: str
    foreign: str | None = None
    #: dense weights (sparsify on load): projection -> shape -> the first tensor of that shape
    dense_shapes: dict[str, dict[tuple[int, ...], str]] = field(default_factory=dict)


def checkpoint_experts(model_dir: Path, suffixes: set[str]) -> dict[str, CheckpointExperts]:
    """Experts layer name -> CheckpointExperts, from the safetensors headers of the files vLLM loads from
    `model_dir` (none for a model that is not a local directory: a hub name, load_format=dummy). A file that
    cannot be read (cut short by a copy, missing from its index) is refused here, by name: vLLM's loader says
    "incomplete metadata" and names no file."""
    layers: dict[str, CheckpointExperts] = {}
    if not model_dir.is_dir():
        return layers
    try:
        handles = [open_shard(path) for path in shard_files(model_dir)]
    except CheckpointError as e:
        raise ValueError(str(e)) from None  # as from_config's
    for handle in handles:
        for name in handle.keys():
            if not (m := _EXPERT_TENSOR.match(name)):
                continue
            expert = int(m["expert"])
            seen = layers.setdefault(m["layer"], CheckpointExperts(expert, name))
            if expert > seen.highest:
                seen.highest, seen.highest_name = expert, name
            if m["suffix"] not in suffixes and seen.foreign is None:
                seen.foreign = name
            if m["suffix"] == "weight":
                shape = tuple(handle.get_slice(name).get_shape())
                seen.dense_shapes.setdefault(m["projection"], {}).setdefault(shape, name)
    return layers


class SamoyedsConfig(QuantizationConfig):
    """Which pattern the experts use, whether the checkpoint holds them packed or dense, the type of the kept
    values (None: the model's dtype), and vLLM's config (`fp8`) of the FP8 block-quantized checkpoint being
    sparsified on load, or of the one a version 3 checkpoint was converted from, for the layers besides the routed
    experts."""

    def __init__(
        self,
        pattern: Pattern | None = None,
        packed: bool = False,
        values: torch.dtype | None = None,
        fp8: Fp8Config | None = None,
    ) -> None:
        super().__init__()
        self.pattern = pattern or Pattern.parse("samoyeds")
        self.packed = packed
        self.values = values
        self.fp8 = fp8
        self.checkpoint_experts: dict[str, CheckpointExperts] = {}

    def __repr__(self) -> str:
        fp8 = f", fp8 blocks {self.fp8.weight_block_size}" if self.fp8 else ""
        return f"SamoyedsConfig(pattern={self.pattern}, packed={self.packed}, values={self.values}{fp8})"

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # sparse tensor cores (mma.sp) arrived with Ampere

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # with no quantization_config in config.json: defaults, sparsify on load

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict, user_quant: str | None, hf_config=None) -> str | None:
        """`--quantization samoyeds` on an FP8 checkpoint: vLLM refuses a method other than the checkpoint's
        unless a config claims the checkpoint here; from_config then gets the checkpoint's fp8 config."""
        if user_quant == QUANT_METHOD and hf_quant_cfg.get("quant_method") == "fp8":
            return QUANT_METHOD
        return None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SamoyedsConfig:
        """From config.json's quantization_config (samoyeds_vllm.format.checkpoint describes its keys), or from an
        FP8 block-quantized checkpoint's (sparsify on load, samoyeds keys beside the fp8 ones)."""
        try:
            parsed = parse_quantization_config(config)
            fp8 = None
            if config.get("quant_method") == "fp8":
                if block_size(config) is None:
                    raise CheckpointError(
                        "--quantization samoyeds reads FP8 checkpoints quantized in blocks (weight_block_size, as "
                        "Qwen3-*-FP8 and DeepSeek-V3), not this one's per-tensor or per-channel scales; use the "
                        "unquantized model"
                    )
                if parsed.packed:
                    raise CheckpointError(
                        "samoyeds quantization_config: format_version (packed experts) cannot describe an FP8 "
                        "block-quantized checkpoint, whose experts load dense and are packed on load"
                    )
                fp8 = Fp8Config.from_config(config)
            elif parsed.other_layers is not None:
                fp8 = Fp8Config.from_config(parsed.other_layers)
        except CheckpointError as e:
            raise ValueError(str(e)) from None
        return cls(parsed.pattern, parsed.packed, parsed.values, fp8)

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        if self.fp8 is not None:  # its modules_to_not_convert name checkpoint modules
            self.fp8.apply_vllm_mapper(hf_to_vllm_mapper)

    def maybe_update_config(self, model_name: str, hf_config=None, revision: str | None = None) -> None:
        """vLLM hands over the model here. Its loader skips, without a word, checkpoint tensors that no parameter
        takes (an expert beyond config.json's count, a dense weight in a packed checkpoint): note what each
        experts layer's tensors are, so that the method refuses such a checkpoint when it creates the layer. A model
        without routed experts is refused: nothing of it would become sparse, and it would serve dense unnoticed."""
        if hf_config is not None:
            _check_has_experts(hf_config)
        self.checkpoint_experts = checkpoint_experts(Path(model_name), self.expert_suffixes)

    @property
    def expert_suffixes(self) -> set[str]:
        """How the checkpoint's expert tensors end: the packed parts, or a dense `weight`."""
        if not self.packed:
            return {"weight", "weight" + SCALE_SUFFIX} if self.fp8 else {"weight"}
        parts = (
            "values",
            "meta",
            *(("rowsel",) if self.pattern.is_samoyeds else ()),
            *(("scale",) if self.values else ()),
        )
        return {SUFFIXES[part] for part in parts}

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, RoutedExperts):
            _check_checkpoint_experts(layer, self.checkpoint_experts.get(prefix), self.expert_suffixes)
            fp8_block = None  # the block of FP8 experts to dequantize on load (packed ones are converted already)
            if (
                self.fp8
                and not self.packed
                and not is_layer_skipped(prefix, self.fp8.ignored_layers, self.packed_modules_mapping)
            ):
                fp8_block = tuple(self.fp8.weight_block_size)
            return SamoyedsMoEMethod(self.pattern, self.packed, layer.moe_config, self.values, fp8_block)
        if self.fp8 is not None:
            # vLLM hands the model's fused-module names (qkv_proj: q, k, v) to this config after building it
            self.fp8.packed_modules_mapping = self.packed_modules_mapping
            return self.fp8.get_quant_method(layer, prefix)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        return None


def _check_has_experts(hf_config) -> None:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    if not any(getattr(text, key, None) for key in EXPERT_COUNT_KEYS):
        raise ValueError(
            f"model_type {getattr(hf_config, 'model_type', None)!r} has no routed experts (its config sets none of "
            f"{', '.join(EXPERT_COUNT_KEYS)}): --quantization samoyeds makes the experts of MoE models sparse and "
            "nothing else; serve this model without it"
        )


def _check_checkpoint_experts(layer: RoutedExperts, found: CheckpointExperts | None, suffixes: set[str]) -> None:
    """Refuse a checkpoint whose tensors for this experts layer vLLM would skip (maybe_update_config)."""
    if found is None:
        return
    experts = layer.moe_config.num_logical_experts
    if found.highest >= experts:
        raise ValueError(
            f"{found.highest_name}: the checkpoint holds expert {found.highest}, but {layer.layer_name} has "
            f"{experts} experts (config.json); the checkpoint and its config do not belong together"
        )
    if found.highest < experts - 1:
        raise ValueError(
            f"{layer.layer_name} has {experts} experts (config.json), but the checkpoint holds experts 0 to "
            f"{found.highest} only ({found.highest_name}); the checkpoint and its config do not belong together"
        )
    if found.foreign is not None:
        raise ValueError(
            f"{found.foreign}: this checkpoint's expert tensors end in {' / '.join(sorted(suffixes))}, so vLLM "
            "would skip this one; the checkpoint is damaged or mixes formats (re-convert it)"
        )
    # vLLM's loader copies a dense expert weight of another shape into part of its parameter without a word,
    # leaving the rest as it was allocated (seen as NaNs at packing, or served as noise)
    config = layer.moe_config
    hidden = config.hidden_dim_unpadded or config.hidden_dim
    inter = (config.intermediate_size_per_partition_unpadded or config.intermediate_size_per_partition) * (
        config.moe_parallel_config.tp_size
    )
    for projection, shapes in found.dense_shapes.items():
        wanted = (hidden, inter) if projection in _DOWN_PROJECTIONS else (inter, hidden)
        for shape, name in shapes.items():
            if shape[-2:] != wanted:
                raise ValueError(
                    f"{name} is {list(shape)} in the checkpoint, but {layer.layer_name} needs {list(wanted)} "
                    f"(config.json: hidden {hidden}, expert intermediate {inter}); the checkpoint is damaged or "
                    "config.json is not its own"
                )
