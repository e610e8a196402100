"""Plain data types of the rollout service: sampling settings in, completions out.

Both travel over the wire as JSON (see ``protocol.py``), so they hold only ints, floats, strings
and lists.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

FinishReason = Literal["stop", "length"]


class SamplingConfigError(ValueError):
    """A :class:`SamplingConfig` field out of range: ``field`` names it, ``problem`` says what is
    wrong (the ``rollout`` section reports it under its own key, ``config/rollout.py``)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"SamplingConfig.{field} {problem}")
        self.field, self.problem = field, problem


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to sample completions.

    ``temperature`` 0 means greedy decoding. ``top_k`` 0 disables top-k, ``top_p`` 1 disables
    top-p. ``stop_token_ids``: generation ends (finish reason "stop") after emitting one of them;
    the stop token is included in the returned ``token_ids``. The model's EOS token is not
    implicit: list it here if it should end generation. ``seed`` makes sampling
    reproducible: prompt ``i`` is sampled with seed ``seed + i`` (its global index, so the result
    does not depend on how prompts are sharded over servers); ``None`` draws fresh randomness.

    The returned logprobs are those of the distribution the token was sampled from: the
    temperature-scaled softmax (spec §1), renormalised over the top-k / top-p set when those are
    active. With ``top_k=0`` and ``top_p=1`` this equals ``log_softmax(z / temperature)``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingConfigError(
                "temperature", f"must be a finite number >= 0, got {self.temperature!r}"
            )
        if not 0 < self.top_p <= 1:
            raise SamplingConfigError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingConfigError("top_k", f"must be an int >= 0, got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SamplingConfigError(
                "max_new_tokens", f"must be an int >= 1, got {self.max_new_tokens!r}"
            )
        for token in self.stop_token_ids:
            if not isinstance(token, int) or token < 0:
                raise SamplingConfigError(
                    "stop_token_ids", f"holds {token!r}; token ids are ints >= 0"
                )
        if self.seed is not None and not isinstance(self.seed, int):
            raise SamplingConfigError("seed", f"must be an int or None, got {self.seed!r}")

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "stop_token_ids": list(self.stop_token_ids)}

    @classmethod
    def from_json(cls, data: dict) -> SamplingConfig:
        return cls(**{**data, "stop_token_ids": tuple(data["stop_token_ids"])})


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled completion of prompt ``prompt_index`` (its ``sample_index``-th of ``n``).

    ``logprobs[t]`` is the log-probability of ``token_ids[t]`` (see :class:`SamplingConfig`);
    both lists have the same length.
    """

    prompt_index: int
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Completion has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs"
            )

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Completion:
        return cls(**data)
