"""How a response is scored (`ScoringConfig`) and the per-response result record.

A verifier decides one of five outcomes for a response; `ScoringConfig` maps the outcome to the
scalar reward the trainer uses (spec §4 turns these into advantages).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from opefo_nemo.rewards.function import split_name

VERIFIERS = ("dapo", "answer", "math_verify")

Verifier = Literal["dapo", "answer", "math_verify"]

INCORRECT_SCORES = {"dapo": -1.0, "answer": 0.0, "math_verify": 0.0}
"""Each verifier's own score for a response that is not correct: the DAPO rule scores −1."""

# Why a response got its score.
CORRECT = "correct"
WRONG = "wrong"
NO_ANSWER = "no_answer"
TIMEOUT = "timeout"
ERROR = "error"
REASONS = (CORRECT, WRONG, NO_ANSWER, TIMEOUT, ERROR)


class ScoringConfigError(ValueError):
    """A `ScoringConfig` field out of range: `field` names it, `problem` says what is wrong (the
    `reward` section reports it under its own key, `config/reward.py`)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"ScoringConfig.{field} {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class ScoringConfig:
    """How the rewards package verifies and scores one response: the verifier (or a function of
    the user's own), what it reads and the score of each outcome. The `reward` section makes
    one (`config/reward.py`, `RewardConfig.scoring`), where its keys are documented."""

    verifier: Verifier = "dapo"
    """One of `VERIFIERS`; what each checks is said by its module: `dapo.py` (the DAPO
    rule exactly), `answer.py`, `symbolic.py` (`math_verify`)."""
    correct_score: float = 1.0
    """The reward of a correct response."""
    incorrect_score: float | None = None
    """`reward.incorrect_score` (its meaning: `config/reward.py`); None: the verifier's own
    (`INCORRECT_SCORES`), 0.0 with `function`."""
    no_answer_score: float | None = None
    """The reward of a response with no answer; None: `incorrect_score`'s."""
    timeout_s: float = 5.0
    """`reward.timeout_s` (its meaning: `config/reward.py`)."""
    strict_box: bool = False
    """`answer` only: read the last `\\boxed{}` in the final `strict_box_chars`
    characters instead of the last `Answer:` line."""
    tail_chars: int | None = 300
    """`dapo` and `answer`: only the final `tail_chars` characters of the response are read
    (the DAPO rule reads 300); None reads the whole response."""
    strict_box_chars: int = 100
    """With `strict_box`: how many final characters hold the box."""
    function: str | None = None
    """A reward function of the user's own, `package.module:callable` (`function.py`), in
    place of `verifier`: its score is the reward, `correct` when it is at least
    `correct_score`."""

    def __post_init__(self) -> None:
        if self.function is not None and split_name(self.function) is None:
            raise ScoringConfigError(
                "function", f"is {self.function!r}; expected package.module:callable"
            )
        if self.verifier not in VERIFIERS:
            raise ScoringConfigError(
                "verifier", f"is {self.verifier!r}; expected one of {VERIFIERS}"
            )
        if self.strict_box and self.verifier != "answer":
            raise ScoringConfigError(
                "strict_box", f"applies to verifier 'answer' only, not {self.verifier!r}"
            )
        if not self.timeout_s > 0:
            raise ScoringConfigError("timeout_s", f"must be > 0, got {self.timeout_s!r}")
        if self.incorrect_score is not None and not self.incorrect_score < self.correct_score:
            raise ScoringConfigError(
                "incorrect_score",
                f"({self.incorrect_score}) must be below the correct score {self.correct_score}",
            )
        if self.tail_chars is not None and self.tail_chars <= 0:
            raise ScoringConfigError("tail_chars", f"must be > 0 or None, got {self.tail_chars!r}")
        if self.strict_box_chars <= 0:
            raise ScoringConfigError(
                "strict_box_chars", f"must be > 0, got {self.strict_box_chars!r}"
            )

    def score_for(self, reason: str) -> float:
        """The scalar reward for an outcome in `REASONS`."""
        if reason == CORRECT:
            return self.correct_score
        incorrect = self.incorrect_score
        if incorrect is None:
            incorrect = 0.0 if self.function is not None else INCORRECT_SCORES[self.verifier]
        if reason == NO_ANSWER:
            return incorrect if self.no_answer_score is None else self.no_answer_score
        if reason in (WRONG, TIMEOUT, ERROR):
            return incorrect
        raise ValueError(f"unknown reward reason {reason!r}; expected one of {REASONS}")


@dataclass(frozen=True)
class RewardResult:
    """The verdict on one response.

    score: the scalar reward (see `ScoringConfig`).
    answer: the answer extracted from the response, normalised (dapo, answer) or as extracted
        (math_verify); None when no answer was found or the time limit was hit.
    reason: one of `REASONS`.
    metrics: a reward function's extra metrics for this response (empty otherwise).
    """

    score: float
    answer: str | None
    reason: str
    metrics: Mapping[str, float] = field(default_factory=dict, hash=False)

    @property
    def correct(self) -> bool:
        return self.reason == CORRECT
