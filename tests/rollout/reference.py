"""Independent references for the rollout tests: a plain Hugging Face forward of the same model."""

from __future__ import annotations

import torch


def load_hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def hf_sampled_logprobs(model, prompt: list[int], tokens: list[int], temperature: float):
    """``log_softmax(logits / temperature)`` of each of ``tokens`` after ``prompt`` (spec §1)."""
    ids = torch.tensor([prompt + tokens])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = (logits / temperature).log_softmax(-1)
    return logprobs.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


@torch.no_grad()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = list(prompt)
    for _ in range(max_new_tokens):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]
