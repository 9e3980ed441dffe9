"""The `samoyeds` quantization config vLLM builds from a checkpoint (or from `--quantization samoyeds`).

Only the routed experts are sparse; router gates, attention and shared experts stay dense (vLLM's unquantized
methods). Two ways in:
- a checkpoint made by `samoyeds-vllm convert` (config.json names the method, the packed tensors are loaded);
- a dense checkpoint (or load_format="dummy") with `--quantization samoyeds`: weights load dense and are pruned
  and packed after loading ("sparsify on load"; pattern samoyeds V=128 with values in the model's dtype unless
  `--hf-overrides '{"quantization_config": {"quant_method": "samoyeds", "pattern": "2:4"}}'` says otherwise,
  `"values": "float8_e4m3fn"` for FP8 values).

vLLM pickles the config to its engine processes, so the class lives at module level.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase

from ..errors import CheckpointError
from ..format import QUANT_METHOD, Pattern, parse_quantization_config
from .moe_method import SamoyedsMoEMethod


class SamoyedsConfig(QuantizationConfig):
    """Which pattern the experts use, whether the checkpoint holds them packed or dense, and the type of the kept
    values (None: the model's dtype)."""

    def __init__(self, pattern: Pattern | None = None, packed: bool = False, values: torch.dtype | None = None) -> None:
        super().__init__()
        self.pattern = pattern or Pattern.parse("samoyeds")
        self.packed = packed
        self.values = values

    def __repr__(self) -> str:
        return f"SamoyedsConfig(pattern={self.pattern}, packed={self.packed}, values={self.values})"

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
    def from_config(cls, config: dict[str, Any]) -> SamoyedsConfig:
        """From config.json's quantization_config (samoyeds_vllm.format.checkpoint describes its keys)."""
        try:
            parsed = parse_quantization_config(config)
        except CheckpointError as e:
            raise ValueError(str(e)) from None
        return cls(parsed.pattern, parsed.packed, parsed.values)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, RoutedExperts):
            return SamoyedsMoEMethod(self.pattern, self.packed, layer.moe_config, self.values)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        return None
