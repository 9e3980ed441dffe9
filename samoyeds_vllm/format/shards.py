"""The safetensors files of a Hugging Face model directory, opened with errors that name the file. The converter's
reader and the vLLM plugin's check before loading both start here, so a damaged checkpoint is refused in the same
words whichever meets it first."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"


def shard_files(model_dir: Path) -> list[Path]:
    """The safetensors files a loader reads from `model_dir`: those its index names, in the order first named
    (vLLM skips files the index leaves out), else every one, sorted. An index that cannot be read, and a file it
    names that the folder lacks, are refused."""
    index = model_dir / INDEX_NAME
    if not index.exists():
        return sorted(model_dir.glob("*.safetensors"))
    try:
        names = list(dict.fromkeys(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index}: not a valid safetensors index ({e}); the checkpoint is damaged") from None
    files = [model_dir / str(name) for name in names]
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {INDEX_NAME} but missing; the checkpoint is incomplete")
    return files


def open_shard(path: Path):
    """`safetensors.safe_open` of one file with its header read, so that a file cut short or damaged is refused by
    name here (safetensors alone says "incomplete metadata" and names no file)."""
    from safetensors import safe_open

    try:
        handle = safe_open(str(path), framework="pt")
        handle.keys()
    except Exception as e:  # safetensors raises its own error type, or OSError
        raise CheckpointError(
            f"{path}: corrupted or truncated safetensors file ({e}); a copy or download that did not finish? "
            "Copy or convert it again"
        ) from None
    return handle
