"""Sampling with the training engine's own model (``rollout=engine``): no server, no refit, every
step samples from exactly the weights being trained, under the vLLM path's contract
(docs/rollout.md, "Generation by the training engine").
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor

from opefo_nemo.models.transformers_compat import last_logits_keyword
from opefo_nemo.rollout.types import Completion, FinishReason, SamplingConfig


class HFGenerator:
    """Generates with ``model`` (a Hugging Face causal LM on ``device``) in the caller's process: a
    rollout engine (``trainer.protocols.RolloutEngine``) over the model an
    :class:`~.hf.HFPolicy` trains. Rows go ``batch_rows`` at a time: prompts left-padded,
    positions counted from each prompt's first token (the trainer's right-padded rows see the
    same positions), one forward per new token over the KV cache. A completion ends after one of
    ``stop_token_ids`` (included, ``"stop"``) or after ``max_new_tokens`` (``"length"``); the
    model's EOS is not implicit. On a CPU the one-token forwards attend with transformers'
    ``eager`` attention: there the scaled-dot-product kernel costs about 1 ms a layer at query
    length 1, more than the layer's matrix products (docs/performance.md, "A real model's step
    beside TRL")."""

    restarts = 0
    """Rollout restarts the trainer's checkpoint records: in-process generation has none."""

    def __init__(self, model: torch.nn.Module, device: torch.device, pad_id: int, batch_rows: int):
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.batch_rows = batch_rows
        self._last_logits_only = last_logits_keyword(model, 1)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[Completion]:
        """``n`` completions per prompt, prompt-major (prompt 0's ``n``, then prompt 1's …)."""
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        completions: list[Completion] = []
        for start in range(0, len(rows), self.batch_rows):
            chunk = rows[start : start + self.batch_rows]
            seeds = [_row_seed(sampling.seed, i * n + j) for i, j in chunk]
            sampled = self._sample([prompts[i] for i, _ in chunk], seeds, sampling)
            for (i, j), (tokens, logprobs, reason) in zip(chunk, sampled, strict=True):
                completions.append(Completion(i, j, tokens, logprobs, reason))
        return completions

    def _sample(
        self, prompts: Sequence[list[int]], seeds: Sequence[int], sampling: SamplingConfig
    ) -> list[tuple[list[int], list[float], FinishReason]]:
        """``(token_ids, logprobs, finish_reason)`` of one completion per prompt. The prompt's
        forward runs once per distinct prompt (a group's ``n`` samples share one), and its KV
        cache and last logits are then copied to each of the prompt's rows."""
        rows, width, steps = len(prompts), max(len(p) for p in prompts), sampling.max_new_tokens
        distinct: dict[tuple[int, ...], int] = {}
        row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for row, prompt in enumerate(distinct):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        uniforms = torch.stack([_uniforms(seed, steps) for seed in seeds]).to(self.device)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        stop = torch.tensor(sampling.stop_token_ids, dtype=torch.long, device=self.device)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **self._last_logits_only,
        )
        logits, cache = out.logits[:, -1], out.past_key_values
        if len(distinct) < rows:
            index = torch.tensor(row_prompt, device=self.device)
            logits, cache = logits.index_select(0, index), _cache_rows(cache, index)
            mask, positions = mask.index_select(0, index), positions.index_select(0, index)
        next_position = positions[:, -1:] + 1
        tokens, logprobs = [], []
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        decoding = _attention(self.model, "eager") if self.device.type == "cpu" else nullcontext()
        with decoding:
            for step in range(steps):
                token, logprob = pick(logits, sampling, uniforms[:, step])
                tokens.append(token)
                logprobs.append(logprob)
                done |= torch.isin(token, stop)
                if step == steps - 1 or bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                out = self.model(
                    input_ids=token[:, None],
                    attention_mask=mask,
                    position_ids=next_position,
                    past_key_values=cache,
                    use_cache=True,
                )
                logits, cache = out.logits[:, -1], out.past_key_values
                next_position = next_position + 1
        return _completions(torch.stack(tokens, 1).cpu(), torch.stack(logprobs, 1).cpu(), stop)

    def update_weights(self, named_weights: Iterable[tuple[str, Tensor]]) -> None:
        """Nothing to load: the generator samples with the trained model itself."""

    def sleep(self) -> None:
        """Nothing to free: generation keeps no state between calls."""

    def wake(self, tags: Sequence[str] | None = None) -> None:
        """Nothing to restore (see :meth:`sleep`)."""

    def close(self) -> None:
        """Nothing to stop: no process, no server."""


def pick(logits: Tensor, sampling: SamplingConfig, uniform: Tensor) -> tuple[Tensor, Tensor]:
    """``(token [B], logprob [B] fp32)`` of one step from the last position's ``logits [B, V]``
    and one uniform in [0, 1) per row (float64). The distribution is ``log_softmax(z / T)`` of
    the fp32 logits ``z`` (spec §1), cut to the ``top_k`` largest and then to the smallest set
    of ``top_p`` mass and renormalised when those are on; the token is the one at the uniform's
    point of the cumulative distribution (inverse CDF), accumulated in float64. ``T = 0`` is
    greedy with the unscaled log-softmax."""
    z = logits.float()
    if sampling.temperature == 0:
        token = z.argmax(dim=-1)
        return token, torch.log_softmax(z, dim=-1).gather(1, token[:, None])[:, 0]
    logp = torch.log_softmax(z * (1.0 / sampling.temperature), dim=-1)
    if sampling.top_k or sampling.top_p < 1:
        logp = torch.log_softmax(_truncate(logp, sampling.top_k, sampling.top_p), dim=-1)
    # exp in fp32: logp carries fp32 rounding already, and float64's exp is ~10x slower on CPU
    cdf = logp.exp().double().cumsum(dim=-1)
    point = uniform.double()[:, None] * cdf[:, -1:]
    token = torch.searchsorted(cdf, point, right=True)[:, 0].clamp(max=logp.shape[-1] - 1)
    return token, logp.gather(1, token[:, None])[:, 0]


def _truncate(logp: Tensor, top_k: int, top_p: float) -> Tensor:
    """``logp`` with ``-inf`` outside the ``top_k`` largest (0: all), then outside the smallest
    set of highest-probability tokens whose renormalised mass reaches ``top_p`` (the token that
    crosses ``top_p`` is kept, so at least one always is)."""
    if top_k:
        kth = logp.topk(min(top_k, logp.shape[-1]), dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1:
        probs, order = torch.softmax(logp, dim=-1).sort(dim=-1, descending=True)
        before = probs.cumsum(dim=-1) - probs  # the mass of the more probable tokens
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(1, order, before >= top_p)
        logp = logp.masked_fill(drop, float("-inf"))
    return logp


def _completions(
    tokens: Tensor, logprobs: Tensor, stop: Tensor
) -> list[tuple[list[int], list[float], FinishReason]]:
    """Each row cut after its first stop token (``"stop"``), else whole (``"length"``)."""
    out = []
    stops = torch.isin(tokens, stop.cpu())
    for row in range(tokens.shape[0]):
        hits = stops[row].nonzero()
        end = int(hits[0]) + 1 if len(hits) else tokens.shape[1]
        reason: FinishReason = "stop" if len(hits) else "length"
        out.append((tokens[row, :end].tolist(), logprobs[row, :end].tolist(), reason))
    return out


def _cache_rows(cache: Any, index: Tensor) -> Any:
    """The KV cache of rows ``index`` (repeats allowed): transformers' ``Cache.reorder_cache``
    (every release since 4.36), or each tensor of a legacy per-layer ``(key, value)`` tuple."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(index)
        return cache
    return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)


@contextmanager
def _attention(model: torch.nn.Module, implementation: str) -> Iterator[None]:
    """``model`` attends with transformers' ``implementation`` inside the block and with its own
    after it: ``set_attn_implementation`` where the release has it, else the config attribute
    that older releases (4.48) read at every forward."""
    hf_model: Any = model
    own: str = hf_model.config._attn_implementation

    def set_attention(name: str) -> None:
        if hasattr(hf_model, "set_attn_implementation"):
            hf_model.set_attn_implementation(name)
        else:
            hf_model.config._attn_implementation = name

    set_attention(implementation)
    try:
        yield
    finally:
        set_attention(own)


def _row_seed(seed: int | None, index: int) -> int:
    """The generator seed of the call's ``index``-th row (``seed + i·n + j`` for sample ``j`` of
    prompt ``i``, so a sample does not depend on how rows are batched); fresh randomness without
    a ``seed``."""
    return secrets.randbits(62) if seed is None else seed + index


def _uniforms(seed: int, steps: int) -> Tensor:
    """``steps`` float64 uniforms in [0, 1) of one row, from a CPU generator seeded ``seed``."""
    return torch.rand(steps, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
