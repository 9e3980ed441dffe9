"""Small helpers shared by the test modules."""

from pathlib import Path

import torch

from samoyeds_vllm.checkpoint import CheckpointReader


def read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory (single file or sharded), by name."""
    reader = CheckpointReader(model_dir)
    return {name: reader.get(name) for name in reader.names()}


def leftovers(parent: Path) -> list[str]:
    """Temporary directories an interrupted write could have left next to its target."""
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".replaced-" in p.name)
