"""Fixtures shared across test modules: tiny models are built once per session."""

from pathlib import Path

import pytest

from samoyeds_vllm.tools.architectures import ARCHITECTURES
from samoyeds_vllm.tools.model_maker import make_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """One tiny random dense model per supported family (seed 0)."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_model(arch, "tiny", root / arch, seed=0) for arch in sorted(ARCHITECTURES)}
