"""The ``advantage`` and ``reward`` sections (``conf/config.yaml``; spec §4,
docs/rewards_data_eval.md). Each field's default is the key's default; its docstring its meaning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from opefo_nemo.core.schema import one_of, require
from opefo_nemo.rewards import VERIFIERS as REWARD_VERIFIERS
from opefo_nemo.rewards import ScoringConfig
from opefo_nemo.rewards.result import ScoringConfigError, Verifier
from opefo_nemo.tasks.verifiers import TASK_VERIFIERS

VERIFIERS = (*TASK_VERIFIERS, *REWARD_VERIFIERS)
"""``reward.verifier``: the built-in tasks' (``tasks/verifiers.py``), then the rewards package's."""


@dataclass(frozen=True)
class AdvantageConfig:
    normalize_std: bool = True
    """Divide by the group's std + 1e-6 (false: Dr. GRPO, r − mean)."""
    leave_one_out: bool = False
    """Baseline = mean of the other K − 1 rewards."""

    def validate(self) -> None:
        """Nothing to range-check: both keys are switches (typed by the schema)."""


@dataclass(frozen=True)
class RewardConfig:
    """The ``reward`` section: what scores a response in training, validation and the commands
    (a built-in task's verifier, one of the rewards package's, or a function of the user's own),
    its time limit and workers, and the overlong shaping added to the score."""

    verifier: str = "arithmetic"
    """``arithmetic`` (the embedded task: a worked solution's final answer) | ``last_number``
    (the last integer of the response) | ``dapo`` (the DAPO rule exactly, the paper's) |
    ``answer`` (same extraction, lenient normalisation) | ``math_verify`` (symbolic
    equivalence)."""
    function: str | None = None
    """A reward of your own in place of ``verifier``: ``package.module:callable``, imported at
    start-up (from ``PYTHONPATH``), called as ``callable(response, ground_truth)`` and returning
    a score, or a mapping with ``"score"`` and extra metrics (each logged as
    ``reward/function/<name>``); a score >= 1.0 counts as correct. null: ``verifier``."""
    timeout_s: float = 5.0
    """Time limit per response (dapo / answer / math_verify / function)."""
    workers: int = 0
    """Reward worker processes (0: score in the trainer process)."""
    incorrect_score: float | None = None
    """Score of a wrong or missing answer (correct = 1.0); null: the verifier's own, -1.0 for
    dapo (the rule), 0.0 for the others. With ``function``: the score of a response whose call
    raised, returned no number or timed out (null: 0.0)."""
    overlong_buffer: int = 0
    """DAPO overlong shaping, off at 0 (the paper does not use it): a response of l tokens gets
    ``factor * min(0, (L - B - l) / B)`` added, L = ``rollout.max_new_tokens``, B = this
    (must be < L)."""
    overlong_penalty_factor: float = 1.0
    """The penalty at l = L is -factor; only with ``overlong_buffer`` > 0."""

    def scoring(self) -> ScoringConfig:
        """How the rewards package scores a response under these keys: by ``function`` when set,
        else by ``verifier``; a built-in task's verifier reads only the scores from it (its
        ``incorrect_score`` defaults to 0.0)."""
        if self.function is not None:
            return ScoringConfig(
                function=self.function,
                timeout_s=self.timeout_s,
                incorrect_score=self.incorrect_score,
            )
        if self.verifier in REWARD_VERIFIERS:
            return ScoringConfig(
                verifier=cast(Verifier, self.verifier),  # one of the rewards package's
                timeout_s=self.timeout_s,
                incorrect_score=self.incorrect_score,
            )
        incorrect = 0.0 if self.incorrect_score is None else self.incorrect_score
        return ScoringConfig(timeout_s=self.timeout_s, incorrect_score=incorrect)

    def validate(self) -> None:
        """Ranges and contradictions of the ``reward`` keys; errors name the key. The keys the
        scoring takes (``function``, ``timeout_s``, ``incorrect_score``) are checked by
        :class:`ScoringConfig` itself, its error reported under the key."""
        one_of(self.verifier, VERIFIERS, "reward.verifier")
        require(self.workers >= 0, "reward.workers", "must be >= 0")
        try:
            self.scoring()
        except ScoringConfigError as error:
            raise ValueError(f"reward.{error.field} {error.problem}") from None
        require(self.overlong_buffer >= 0, "reward.overlong_buffer", "must be >= 0 (0 = off)")
        require(self.overlong_penalty_factor >= 0, "reward.overlong_penalty_factor", "must be >= 0")
        require(
            self.overlong_buffer > 0 or self.overlong_penalty_factor == 1.0,
            "reward.overlong_penalty_factor",
            "has no effect while reward.overlong_buffer is 0 (shaping off): set both or neither",
        )
