"""Every test in this folder needs an NVIDIA GPU: marked `gpu` and skipped with that reason elsewhere."""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(item.fspath).is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Intermediate buffers start as NaN (SAMOYEDS_POISON), so an element the kernels fail to write fails a test."""
    monkeypatch.setenv("SAMOYEDS_POISON", "1")
