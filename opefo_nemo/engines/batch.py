"""The rollout batch as padded tensors, phases 1 and 3's input (docs/architecture.md): one response
with its prompt per row, right-padded; per-token tensors ``[B, T − 1]`` predict
``input_ids[:, 1:]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor


@dataclass(frozen=True)
class TrainBatch:
    """Padded token tensors of ``B`` responses.

    ``input_ids`` int64 ``[B, T]`` (right-padded with ``pad_id``), ``attention_mask`` bool
    ``[B, T]``. Per predicted token ``[B, T − 1]``: ``targets`` (``input_ids[:, 1:]``),
    ``response_mask`` (bool), ``advantages`` (fp32) and ``token_ids`` (int64 unique global ids
    ``row * (T − 1) + t``, for the layout-independent Clip-Cov/KL-Cov selections) and, when the
    rollout engine reported them, ``rollout_logprob`` (fp32, its log-probability of each response
    token, 0 elsewhere).
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    advantages: Tensor
    token_ids: Tensor
    rollout_logprob: Tensor | None = None

    def __post_init__(self) -> None:
        rows, width = self.input_ids.shape
        per_token = (rows, width - 1)
        if tuple(self.attention_mask.shape) != (rows, width):
            raise ValueError(
                f"attention_mask shape {tuple(self.attention_mask.shape)} != {rows, width}"
            )
        for name in ("response_mask", "advantages", "token_ids", "rollout_logprob"):
            tensor = getattr(self, name)
            if tensor is not None and tuple(tensor.shape) != per_token:
                raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {per_token}")

    @property
    def targets(self) -> Tensor:
        """``[B, T − 1]`` the token predicted at each position."""
        return self.input_ids[:, 1:]

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    @property
    def first_response_column(self) -> int:
        """The first column of ``[B, T − 1]`` that predicts a response token in any row (0 when
        none does): every column before it predicts a prompt token in every row."""
        columns = self.response_mask.any(dim=0).nonzero()
        return int(columns[0]) if len(columns) else 0

    def select(self, rows: Sequence[int] | Tensor) -> TrainBatch:
        """The sub-batch of ``rows``, trimmed to its longest row (padding only sits at the end)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        picked = {
            f.name: getattr(self, f.name)[index]
            for f in fields(self)
            if getattr(self, f.name) is not None
        }
        width = max(int(picked["attention_mask"].sum(dim=1).max()), 2)
        trimmed = {
            name: value[:, : width if name in _FULL else width - 1]
            for name, value in picked.items()
        }
        return TrainBatch(**trimmed)

    def split(self, size: int) -> list[TrainBatch]:
        """Consecutive sub-batches of at most ``size`` rows (micro- or mini-batches)."""
        if size < 1:
            raise ValueError(f"batch split size must be >= 1, got {size}")
        return [self.select(range(s, min(s + size, self.rows))) for s in range(0, self.rows, size)]


_FULL = ("input_ids", "attention_mask")


def build_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    advantages: Tensor,
    pad_id: int,
    rollout_logprobs: Sequence[Sequence[float]] | None = None,
) -> TrainBatch:
    """Pack ``B`` (prompt, response) token lists and per-response advantages ``[B]``, each
    broadcast to its response's tokens (spec §4).

    Every prompt needs at least one token and every response at least one (an empty response
    has nothing to learn from: the caller drops it before). ``rollout_logprobs``: the rollout
    engine's log-probability of each response token (one list per response, its length).
    """
    if not (len(prompts) == len(responses) == advantages.numel()):
        raise ValueError(
            f"{len(prompts)} prompts, {len(responses)} responses and {advantages.numel()} "
            "advantages: one of each per row"
        )
    if not prompts:
        raise ValueError("cannot build a training batch of zero responses")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(max(lengths), 2)
    rows = len(prompts)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.bool)
    response_mask = torch.zeros((rows, width - 1), dtype=torch.bool)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        if not prompt or not response:
            raise ValueError(f"row {row}: prompt and response must both be non-empty")
        ids = list(prompt) + list(response)
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[row, : len(ids)] = True
        response_mask[row, len(prompt) - 1 : len(ids) - 1] = True
    adv = advantages.float().reshape(rows, 1).expand(rows, width - 1)
    adv = torch.where(response_mask, adv, torch.zeros_like(adv)).contiguous()
    token_ids = torch.arange(rows * (width - 1), dtype=torch.long).reshape(rows, width - 1)
    rollout = None
    if rollout_logprobs is not None:
        rollout = torch.zeros((rows, width - 1), dtype=torch.float32)
        for row, (prompt, logprobs) in enumerate(zip(prompts, rollout_logprobs, strict=True)):
            if len(logprobs) != len(responses[row]):
                raise ValueError(
                    f"row {row}: {len(logprobs)} rollout logprobs for "
                    f"{len(responses[row])} response tokens"
                )
            start = len(prompt) - 1
            rollout[row, start : start + len(logprobs)] = torch.tensor(logprobs)
    return TrainBatch(input_ids, attention, response_mask, adv, token_ids, rollout)


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """``tensor`` (host memory) on ``device`` without making the host wait: on a GPU copied from
    pinned memory with ``non_blocking=True`` (a copy from pageable memory is synchronous), later
    kernels on the stream see it complete; elsewhere the plain copy (or ``tensor`` itself)."""
    target = torch.device(device)
    if target.type == "cuda" and tensor.device.type == "cpu":
        tensor = tensor.pin_memory()
    return tensor.to(target, non_blocking=True)
