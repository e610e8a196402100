"""Sampling with the training engine's own model (``rollout=engine``): no server, no refit, every
step samples from exactly the weights being trained, under the vLLM path's contract
(docs/rollout.md, "Generation by the training engine").
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from opefo_nemo.engines.decode_cache import cut_unattended, join, joinable, select_rows
from opefo_nemo.models.transformers_compat import last_logits_keyword
from opefo_nemo.rollout.types import Completion, FinishReason, SamplingConfig


class HFGenerator:
    """Generates with ``model`` (a Hugging Face causal LM on ``device``) in the caller's process: a
    rollout engine (``orchestration.protocols.RolloutEngine``) over the model an
    :class:`~.hf.HFPolicy` trains. At most ``batch_rows`` rows decode together, one forward per
    new token over the KV cache: a row leaves the batch as soon as it ends, and waiting rows join
    it (their prompts' forward, left-padded, positions counted from each prompt's first token as
    in the trainer's right-padded rows) once half of it is free. A completion ends after one of
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
        self.join_at = max(1, batch_rows // 2)
        """Free rows in the batch that let waiting rows join: each joining runs a prompts'
        forward and copies the cache, about one decoding step's cost, so it waits for half."""
        self._last_logits_only = last_logits_keyword(model, 1)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[Completion]:
        """``n`` completions per prompt, prompt-major (prompt 0's ``n``, then prompt 1's …)."""
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        seeds = [_row_seed(sampling.seed, i * n + j) for i, j in rows]
        samples = self._sample([prompts[i] for i, _ in rows], seeds, sampling)
        return [
            Completion(i, j, tokens, logprobs, reason)
            for (i, j), (tokens, logprobs, reason) in zip(rows, samples.completions(), strict=True)
        ]

    def _sample(
        self, prompts: Sequence[list[int]], seeds: Sequence[int], sampling: SamplingConfig
    ) -> _Samples:
        """One completion per prompt. Rows join in order, ``batch_rows`` at first, then whenever
        :attr:`join_at` rows are free; where the model's cache cannot take rows in
        (:func:`~.decode_cache.joinable`), only once the batch is empty."""
        samples = _Samples(len(prompts), sampling, self.device)
        batch: _Batch | None = None
        waiting, joins = 0, False
        while True:
            rows = range(waiting, min(len(prompts), waiting + self.batch_rows - _size(batch)))
            if len(rows):
                entering = self._prefill([prompts[r] for r in rows], rows, seeds, sampling)
                batch = entering if batch is None else batch.join(entering)
                joins, waiting = joinable(batch.cache), rows.stop
            if batch is None:
                return samples
            room = self.join_at if joins and waiting < len(prompts) else self.batch_rows
            with self._decoding():
                batch = self._decode(batch, samples, room)

    def _prefill(
        self,
        prompts: Sequence[list[int]],
        rows: range,
        seeds: Sequence[int],
        sampling: SamplingConfig,
    ) -> _Batch:
        """The batch of rows ``rows`` (their ``prompts``) ready to sample their first token. The
        prompt's forward runs once per distinct prompt (a group's ``n`` samples share one), and
        its KV cache and last logits are then copied to each of the prompt's rows."""
        distinct: dict[tuple[int, ...], int] = {}
        row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        width = max(len(p) for p in distinct)
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for row, prompt in enumerate(distinct):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **self._last_logits_only,
        )
        logits, cache = out.logits[:, -1], out.past_key_values
        if len(distinct) < len(prompts):
            index = torch.tensor(row_prompt, device=self.device)
            logits, cache = logits.index_select(0, index), select_rows(cache, index)
            mask, positions = mask.index_select(0, index), positions.index_select(0, index)
        steps = sampling.max_new_tokens
        uniforms = torch.stack([_uniforms(seeds[r], steps) for r in rows]).to(self.device)
        numbers = torch.tensor(rows, device=self.device)
        return _Batch(numbers, uniforms, logits, cache, mask, positions[:, -1:] + 1)

    def _decoding(self) -> AbstractContextManager[None]:
        """Where the one-token forwards run: with ``eager`` attention on a CPU (class
        docstring), with the model's own elsewhere."""
        return _attention(self.model, "eager") if self.device.type == "cpu" else nullcontext()

    def _decode(self, batch: _Batch, samples: _Samples, room: int) -> _Batch | None:
        """Samples a token for every row of ``batch``, lets the rows that ended leave and runs
        the one-token forward of the others, until ``room`` rows of the batch are free (then
        the batch, each row's next logits computed) or none is left (``None``)."""
        while True:
            token = samples.draw(batch)
            going = samples.going(batch.rows, token)
            if not bool(going.all()):
                kept = going.nonzero()[:, 0]
                if not len(kept):
                    return None
                batch, token = batch.select(kept), token.index_select(0, kept)
            batch = batch.advanced(self.model, token)
            if self.batch_rows - _size(batch) >= room:
                return batch

    def update_weights(self, named_weights: Iterable[tuple[str, Tensor]]) -> None:
        """Nothing to load: the generator samples with the trained model itself."""

    def sleep(self) -> None:
        """Nothing to free: generation keeps no state between calls."""

    def wake(self, tags: Sequence[str] | None = None) -> None:
        """Nothing to restore (see :meth:`sleep`)."""

    def close(self) -> None:
        """Nothing to stop: no process, no server."""


@dataclass
class _Batch:
    """The rows decoding together, one entry per row along each tensor's first dimension."""

    rows: Tensor
    """``[B]`` the call's row numbers."""
    uniforms: Tensor
    """``[B, max_new_tokens]`` each row's own uniforms (float64), one per position."""
    logits: Tensor
    """``[B, V]`` the logits of each row's next token."""
    cache: Any
    """The KV cache (``engines/decode_cache.py``)."""
    mask: Tensor
    """``[B, C]`` the cache's columns each row attends to (1) or not (0: padding)."""
    position: Tensor
    """``[B, 1]`` each row's next token's position, counted from its prompt's first token."""

    def select(self, kept: Tensor) -> _Batch:
        """Rows ``kept`` only: the others' cache rows go, and the columns only they attended
        to where the cache allows (:func:`~.decode_cache.cut_unattended`)."""
        cache, mask = select_rows(self.cache, kept), self.mask.index_select(0, kept)
        if joinable(cache):
            cache, mask = cut_unattended(cache, mask)
        return _Batch(
            self.rows.index_select(0, kept),
            self.uniforms.index_select(0, kept),
            self.logits.index_select(0, kept),
            cache,
            mask,
            self.position.index_select(0, kept),
        )

    def join(self, other: _Batch) -> _Batch:
        """These rows, then ``other``'s (both caches :func:`~.decode_cache.joinable`)."""
        cache, mask = join(self.cache, self.mask, other.cache, other.mask)
        return _Batch(
            torch.cat([self.rows, other.rows]),
            torch.cat([self.uniforms, other.uniforms]),
            torch.cat([self.logits, other.logits]),
            cache,
            mask,
            torch.cat([self.position, other.position]),
        )

    def advanced(self, model: torch.nn.Module, token: Tensor) -> _Batch:
        """The batch after the one-token forward of each row's sampled ``token [B]``."""
        mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=self.position,
            past_key_values=self.cache,
            use_cache=True,
        )
        logits, cache = out.logits[:, -1], out.past_key_values
        return _Batch(self.rows, self.uniforms, logits, cache, mask, self.position + 1)


class _Samples:
    """The tokens and logprobs sampled so far, ``[rows, max_new_tokens]`` each, and how many
    each row has."""

    def __init__(self, rows: int, sampling: SamplingConfig, device: torch.device):
        self.sampling = sampling
        steps = sampling.max_new_tokens
        self.tokens = torch.zeros((rows, steps), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, steps), dtype=torch.float32, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.stop = torch.tensor(sampling.stop_token_ids, dtype=torch.long, device=device)

    def draw(self, batch: _Batch) -> Tensor:
        """Samples and records each row's next token (:func:`pick`, at the row's own uniform
        for its position); returns the tokens ``[B]``."""
        step = self.lengths.index_select(0, batch.rows)
        uniform = batch.uniforms.gather(1, step[:, None])[:, 0]
        token, logprob = pick(batch.logits, self.sampling, uniform)
        self.tokens[batch.rows, step] = token
        self.logprobs[batch.rows, step] = logprob
        self.lengths[batch.rows] = step + 1
        return token

    def going(self, rows: Tensor, token: Tensor) -> Tensor:
        """``[B]`` whether each of ``rows`` goes on after its newest ``token``: no stop token
        and fewer than ``max_new_tokens``."""
        room = self.lengths.index_select(0, rows) < self.sampling.max_new_tokens
        return room & ~torch.isin(token, self.stop)

    def completions(self) -> list[tuple[list[int], list[float], FinishReason]]:
        """``(token_ids, logprobs, finish_reason)`` per row: ``"stop"`` where the last token is
        a stop token, else ``"length"``."""
        stop = set(self.sampling.stop_token_ids)
        out = []
        for tokens, logprobs, length in zip(
            self.tokens.tolist(), self.logprobs.tolist(), self.lengths.tolist(), strict=True
        ):
            reason: FinishReason = "stop" if tokens[length - 1] in stop else "length"
            out.append((tokens[:length], logprobs[:length], reason))
        return out


def _size(batch: _Batch | None) -> int:
    """The rows decoding in ``batch`` (none without one)."""
    return 0 if batch is None else len(batch.rows)


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
