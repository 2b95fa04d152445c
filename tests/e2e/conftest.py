"""Session fixtures of the end-to-end tier: one tiny model shared by every test (vLLM
engines start in each run's replica actors; the Ray cluster comes from tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from shunter.engine.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "sort-tiny", "sort_digits", seed=0, sft_steps=25))
