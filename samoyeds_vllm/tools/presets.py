"""Model presets: real config.json files under configs/models (a tiny one per family, and real shapes), found by name.

A preset is named by its file (`qwen3-30b-a3b`); `tiny` means the tiny preset of a family (`tiny-qwen3_moe`).
"""

from __future__ import annotations

import json
from importlib import resources

from ..errors import SamoyedsError
from .architectures import ALIASES, ARCHITECTURES, MoEShape, moe_shape

TINY = "tiny"


def _presets_dir():
    return resources.files("samoyeds_vllm.configs") / "models"


def available_presets() -> dict[str, str]:
    """Preset name -> its model_type, for every JSON file under configs/models."""
    presets = {}
    for entry in _presets_dir().iterdir():
        if entry.name.endswith(".json"):
            presets[entry.name.removesuffix(".json")] = json.loads(entry.read_text())["model_type"]
    return dict(sorted(presets.items()))


def _presets_for(arch: str, presets: dict[str, str]) -> str:
    names = [TINY if name == f"{TINY}-{arch}" else name for name, model_type in presets.items() if model_type == arch]
    return ", ".join(sorted(names)) or "none"


def preset_family(preset: str) -> str:
    """The model family (model_type) of a preset name, or a clear error listing the presets."""
    presets = available_presets()
    if preset not in presets:
        raise SamoyedsError(f"unknown preset {preset!r}; choose one of {', '.join(presets)}")
    return presets[preset]


def load_preset(arch: str, preset: str) -> dict:
    """The config.json dict of `preset` ("tiny" or a preset name) for model family `arch`, checked to match. An
    alias names the family whose checkpoints it shares (kimi_k2: deepseek_v3)."""
    arch = ALIASES.get(arch, arch)
    presets = available_presets()
    families = sorted(set(ARCHITECTURES) | set(presets.values()))
    if arch not in families:
        raise SamoyedsError(f"unknown architecture {arch!r}; supported: {', '.join(sorted([*families, *ALIASES]))}")
    name = f"{TINY}-{arch}" if preset == TINY else preset.removesuffix(".json")
    if name not in presets:
        raise SamoyedsError(
            f"no preset {preset!r} for {arch}; presets for {arch}: {_presets_for(arch, presets)} "
            f"(all presets: {', '.join(presets)})"
        )
    if presets[name] != arch:
        raise SamoyedsError(
            f"preset {preset!r} is a {presets[name]} model, not {arch}; presets for {arch}: "
            f"{_presets_for(arch, presets)}"
        )
    return json.loads((_presets_dir() / f"{name}.json").read_text())


def preset_shape(preset: str) -> MoEShape:
    """The routed-expert shape of a preset."""
    return moe_shape(load_preset(preset_family(preset), preset))
