"""What the real-model tests share: the chat questions they ask and the rows they make of them,
the float64 statistics of a ``transformers`` forward they compare the engines against, and the
rollout environment's Python."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

QUESTIONS = ("What is 3 + 5?", "What is 7 + 2?", "What is 0 + 9?")
ANSWERS = ("3 + 5 = 8.", "The sum of 7 and 2 is 9", "9")


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


def rollout_python() -> str | None:
    """The rollout environment's Python where it is built (scripts/setup_rollout_env.sh), else
    None (the servers then run on this one)."""
    venv = Path(os.environ.get("OPEFO_ROLLOUT_VENV", ROOT / ".venv-rollout"))
    return str(venv / "bin" / "python") if (venv / "bin" / "python").exists() else None
