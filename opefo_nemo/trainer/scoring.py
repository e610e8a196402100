"""Responses → rewards, with failures scored 0 and counted, never raised (issue 6 errors).

``integer`` is the embedded arithmetic task's exact-match verifier; ``dapo`` and ``math_verify``
are :mod:`opefo_nemo.rewards`' (which already turn a crashing or slow item into an ``error`` or
``timeout`` reason scored like a wrong answer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..config.train import RewardSettings
from ..rewards import RewardConfig, RewardResult, score_batch
from ..rewards.result import ERROR
from ..tasks.arithmetic import score_integer


def score_responses(
    responses: Sequence[str], ground_truths: Sequence[str], settings: RewardSettings
) -> list[RewardResult]:
    """One result per response, in order."""
    if settings.verifier != "integer":
        config = RewardConfig(verifier=settings.verifier, timeout_s=settings.timeout_s)
        return score_batch(responses, ground_truths, config=config, workers=settings.workers)
    config = RewardConfig()
    results = []
    for response, truth in zip(responses, ground_truths, strict=True):
        try:
            results.append(score_integer(response, truth, config))
        except Exception:
            results.append(RewardResult(config.score_for(ERROR), None, ERROR))
    return results


def reason_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """``reward/<reason>_frac`` for every outcome, and ``reward/failed`` (error + timeout count)."""
    counts = Counter(r.reason for r in results)
    n = max(len(results), 1)
    out = {
        f"reward/{reason}_frac": counts[reason] / n for reason in ("correct", "wrong", "no_answer")
    }
    out["reward/failed"] = float(counts["error"] + counts["timeout"])
    return out
