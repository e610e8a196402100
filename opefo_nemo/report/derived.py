"""Series the report computes from a run's records instead of reading one logged key: the
cumulative realized change, drift and entropy change, and ``val/pass@largest``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Records = Sequence[Mapping[str, Any]]
Points = list[tuple[int, float]]

PASS_PREFIX = "val/pass@"
LARGEST_PASS = "val/pass@largest"


def _transitions(records: Records) -> list[tuple[int, float, float, float]]:
    """``(s, R_{s−1}, D_s, H_s − H_{s−1})`` for each step ``s`` whose drift is logged (those
    after a step that measured ``flow/realized``, spec §6): ``R`` is ``flow/realized``, ``D``
    ``flow/drift``, ``H`` ``entropy/mean``."""
    by_step = {r["step"]: r for r in records}
    found = []
    for record in records:
        step, before = record["step"], by_step.get(record["step"] - 1, {})
        drift, entropy = record.get("flow/drift"), record.get("entropy/mean")
        realized, previous = before.get("flow/realized"), before.get("entropy/mean")
        if drift is None or entropy is None or realized is None or previous is None:
            continue
        found.append((step, realized, drift, entropy - previous))
    return found


def _cumulative(index: int) -> Callable[[Records], Points]:
    """``cumulative/realized``, ``…/drift``, ``…/entropy_change``: the running sums, drawn at
    ``s``, of ``R_{s−1}``, ``D_s`` or ``H_s − H_{s−1}`` over :func:`_transitions`. The last is
    the sum of the first two up to rounding: the sampled entropy's change split into what the
    updates did to their own batches and what no batch saw. With ``metrics.realized_every=1`` it
    is ``H_s − H_1``; with ``N > 1`` it covers one transition in ``N``."""

    def series(records: Records) -> Points:
        points, total = [], 0.0
        for transition in _transitions(records):
            total += transition[index]
            points.append((transition[0], total))
        return points

    return series


def largest_pass_k(records: Records) -> int | None:
    """The largest k of the ``val/pass@k`` keys the run logged (``None``: it logged none)."""
    ks = [
        int(key[len(PASS_PREFIX) :])
        for record in records
        for key in record
        if key.startswith(PASS_PREFIX) and key[len(PASS_PREFIX) :].isdigit()
    ]
    return max(ks, default=None)


def _largest_pass(records: Records) -> Points:
    k = largest_pass_k(records)
    key = f"{PASS_PREFIX}{k}"
    return [(r["step"], r[key]) for r in records if r.get(key) is not None]


DERIVED: dict[str, Callable[[Records], Points]] = {
    "cumulative/realized": _cumulative(1),
    "cumulative/drift": _cumulative(2),
    "cumulative/entropy_change": _cumulative(3),
    LARGEST_PASS: _largest_pass,
}
