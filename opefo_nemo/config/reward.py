"""The ``advantage`` and ``reward`` sections (``conf/config.yaml``; spec §4,
docs/rewards_data_eval.md). Each field's default is the key's default; its docstring its meaning."""

from __future__ import annotations

from dataclasses import dataclass

from opefo_nemo.core.schema import one_of, require
from opefo_nemo.rewards import VERIFIERS as REWARD_VERIFIERS
from opefo_nemo.rewards.function import split_name
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

    def validate(self) -> None:
        """Ranges and contradictions of the ``reward`` keys; errors name the key."""
        one_of(self.verifier, VERIFIERS, "reward.verifier")
        require(
            self.function is None or split_name(self.function) is not None,
            "reward.function",
            f"is {self.function!r}; expected package.module:callable (or null)",
        )
        require(self.timeout_s > 0, "reward.timeout_s", "must be > 0")
        require(self.workers >= 0, "reward.workers", "must be >= 0")
        require(
            self.incorrect_score is None or self.incorrect_score < 1.0,
            "reward.incorrect_score",
            f"({self.incorrect_score}) must be below the correct score 1.0, or null",
        )
        require(self.overlong_buffer >= 0, "reward.overlong_buffer", "must be >= 0 (0 = off)")
        require(self.overlong_penalty_factor >= 0, "reward.overlong_penalty_factor", "must be >= 0")
        require(
            self.overlong_buffer > 0 or self.overlong_penalty_factor == 1.0,
            "reward.overlong_penalty_factor",
            "has no effect while reward.overlong_buffer is 0 (shaping off): set both or neither",
        )
