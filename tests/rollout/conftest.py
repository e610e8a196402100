"""Shared fixtures: the tiny model (built once per session) and a Hugging Face reference forward."""

from __future__ import annotations

import pytest

from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model

# Larger than the Hugging Face default 0.02 so next-token distributions are far from uniform and
# logprob comparisons have something to distinguish.
TEST_SPEC = TinyModelSpec(initializer_range=0.1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", TEST_SPEC, seed=0)
