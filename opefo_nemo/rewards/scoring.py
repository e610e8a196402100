"""Score responses against ground-truth answers, one in this process (`score`) or a list
(`score_batch`), results in input order; model output never raises: bad output is scored, with a
reason (docs/rewards_data_eval.md, "Rewards", "Time limits").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opefo_nemo.rewards.answer import extract_answer, normalize_answer
from opefo_nemo.rewards.dapo import dapo_answer, dapo_correct
from opefo_nemo.rewards.function import load_reward_function, read_reward
from opefo_nemo.rewards.result import (
    CORRECT,
    ERROR,
    NO_ANSWER,
    TIMEOUT,
    WRONG,
    RewardResult,
    ScoringConfig,
)
from opefo_nemo.rewards.time_limit import VerificationTimeout, time_limit

if TYPE_CHECKING:
    from opefo_nemo.rewards.pool import RewardPool


def resolve_config(
    verifier: str | None, config: ScoringConfig | None, timeout_s: float | None = None
) -> ScoringConfig:
    """`config` (default `ScoringConfig()`) with `verifier` and `timeout_s` applied when given."""
    config = config if config is not None else ScoringConfig()
    changes: dict[str, Any] = {}
    if verifier is not None:
        changes["verifier"] = verifier
    if timeout_s is not None:
        changes["timeout_s"] = timeout_s
    return dataclasses.replace(config, **changes) if changes else config


def _check_ground_truth(ground_truth: object, where: str = "ground_truth") -> None:
    if not isinstance(ground_truth, str):
        raise TypeError(f"{where} must be a str, got {type(ground_truth).__name__}")


def _verify(response: str, ground_truth: str, config: ScoringConfig) -> tuple[str, str | None]:
    """(reason, answer) for one response; may raise on internal failure or time out."""
    if config.verifier == "dapo":
        answer = dapo_answer(response, config.tail_chars)
        if answer is None:
            return NO_ANSWER, None
        return (CORRECT if dapo_correct(answer, ground_truth) else WRONG), answer
    if config.verifier == "answer":
        raw = extract_answer(
            response, config.strict_box, config.tail_chars, config.strict_box_chars
        )
        answer = normalize_answer(raw) if raw is not None else ""
        if not answer:
            return NO_ANSWER, None
        return (CORRECT if answer == normalize_answer(ground_truth) else WRONG), answer
    from opefo_nemo.rewards.symbolic import verify_symbolic

    verdict, answer, gold_parsed = verify_symbolic(response, ground_truth)
    if verdict is None:
        return NO_ANSWER, None
    if not gold_parsed:
        return ERROR, answer
    return (CORRECT if verdict else WRONG), answer


def _call_function(response: str, ground_truth: str, config: ScoringConfig) -> RewardResult:
    """The user's reward function on one response; may raise (its own error, a bad return)."""
    assert config.function is not None
    function = load_reward_function(config.function)
    value, metrics = read_reward(function(response, ground_truth))
    reason = CORRECT if value >= config.correct_score else WRONG
    return RewardResult(value, None, reason, metrics)


def score_with_config(response: object, ground_truth: str, config: ScoringConfig) -> RewardResult:
    """Verify one response in this process under `config`'s soft time limit; never raises on
    the response (a non-str response, an internal error, a reward function that raises or
    returns no number, or a timeout become reasons)."""
    if not isinstance(response, str):
        return RewardResult(config.score_for(ERROR), None, ERROR)
    try:
        if config.function is None and config.verifier == "math_verify":
            # math-verify and sympy load before the limit starts: seconds on a loaded machine,
            # which would otherwise be charged to a process's first response as its timeout
            import opefo_nemo.rewards.symbolic  # noqa: F401
        if config.function is not None:  # so is the user's module, imported once per process
            load_reward_function(config.function)
        with time_limit(config.timeout_s):
            if config.function is not None:
                return _call_function(response, ground_truth, config)
            reason, answer = _verify(response, ground_truth, config)
    except VerificationTimeout:
        reason, answer = TIMEOUT, None
    except Exception:
        reason, answer = ERROR, None
    return RewardResult(config.score_for(reason), answer, reason)


def score(
    response: str,
    ground_truth: str,
    verifier: str | None = None,
    *,
    config: ScoringConfig | None = None,
) -> RewardResult:
    """Score one response against its ground-truth answer.

    verifier: "dapo", "answer" or "math_verify"; None keeps `config.verifier` ("dapo" by
    default). `config` sets the scores for each outcome, the time limit and the extraction
    options (default `ScoringConfig()`: the DAPO rule, +1 / −1).
    Returns a `RewardResult` with `score`, `answer` and `reason`.
    """
    _check_ground_truth(ground_truth)
    return score_with_config(response, ground_truth, resolve_config(verifier, config))


def score_batch(
    responses: Sequence[str],
    ground_truths: Sequence[str],
    verifier: str | None = None,
    *,
    config: ScoringConfig | None = None,
    workers: int = 0,
    timeout_s: float | None = None,
    pool: RewardPool | None = None,
) -> list[RewardResult]:
    """Score `responses[i]` against `ground_truths[i]`; results in input order.

    workers=0 scores in this process (soft time limit: it cannot stop a single long C call);
    workers>0 starts a `RewardPool` of that many processes for this call (hard limit, but
    process start-up costs about a second); `pool` reuses a running `RewardPool` (its own
    config and workers apply, `verifier`/`config`/`workers`/`timeout_s` must be left unset).
    """
    if len(responses) != len(ground_truths):
        raise ValueError(
            f"score_batch got {len(responses)} responses but {len(ground_truths)} ground truths"
        )
    for i, ground_truth in enumerate(ground_truths):
        _check_ground_truth(ground_truth, f"ground_truths[{i}]")
    if pool is not None:
        if verifier is not None or config is not None or timeout_s is not None or workers:
            raise ValueError("score_batch: pass either pool or verifier/config/workers/timeout_s")
        return pool.score(responses, ground_truths)
    if workers < 0:
        raise ValueError(f"score_batch: workers must be >= 0, got {workers}")
    resolved = resolve_config(verifier, config, timeout_s)
    if workers == 0 or not responses:
        return [
            score_with_config(r, g, resolved) for r, g in zip(responses, ground_truths, strict=True)
        ]
    from opefo_nemo.rewards.pool import RewardPool

    with RewardPool(min(workers, len(responses)), resolved) as running:
        return running.score(responses, ground_truths)
