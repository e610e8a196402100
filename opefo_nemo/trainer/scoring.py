"""Responses → rewards, with failures scored like a wrong answer and counted, never raised
(docs/rewards_data_eval.md, "Rewards").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from opefo_nemo.config.reward import RewardConfig
from opefo_nemo.rewards import RewardResult, overlong_penalty, score_batch
from opefo_nemo.rewards.result import ERROR
from opefo_nemo.tasks.verifiers import TASK_VERIFIERS


def score_responses(
    responses: Sequence[str], ground_truths: Sequence[str], settings: RewardConfig
) -> list[RewardResult]:
    """One result per response, in order: by ``reward.function`` when set, else by
    ``reward.verifier``. :mod:`opefo_nemo.rewards` turns a crashing or slow item into an
    ``error`` or ``timeout`` reason scored like a wrong answer; a built-in task's verifier that
    raises is scored as an ``error`` here."""
    config = settings.scoring()
    if settings.function is not None or settings.verifier not in TASK_VERIFIERS:
        return score_batch(responses, ground_truths, config=config, workers=settings.workers)
    verify = TASK_VERIFIERS[settings.verifier]
    results = []
    for response, truth in zip(responses, ground_truths, strict=True):
        try:
            results.append(verify(response, truth, config))
        except Exception:
            results.append(RewardResult(config.score_for(ERROR), None, ERROR))
    return results


def overlong_penalties(
    lengths: Sequence[int], settings: RewardConfig, max_new_tokens: int
) -> list[float]:
    """The overlong penalty of each response (its token count), all 0.0 when the shaping is off
    (``reward.overlong_buffer=0``); the maximum length is ``rollout.max_new_tokens``."""
    return [
        overlong_penalty(
            length, max_new_tokens, settings.overlong_buffer, settings.overlong_penalty_factor
        )
        for length in lengths
    ]


def reason_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """``reward/<reason>_frac`` for every outcome, ``reward/failed`` (error + timeout count),
    and each extra metric of a reward function, ``reward/function/<name>``: its mean over the
    responses that reported it."""
    counts = Counter(r.reason for r in results)
    n = max(len(results), 1)
    out = {
        f"reward/{reason}_frac": counts[reason] / n for reason in ("correct", "wrong", "no_answer")
    }
    out["reward/failed"] = float(counts["error"] + counts["timeout"])
    reported: dict[str, list[float]] = defaultdict(list)
    for result in results:
        for name, value in result.metrics.items():
            reported[name].append(value)
    for name, values in sorted(reported.items()):
        out[f"reward/function/{name}"] = sum(values) / len(values)
    return out
