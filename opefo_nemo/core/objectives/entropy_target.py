"""The entropy target of a closed-loop method (spec §3, §5): ``H_target`` in nats, or
``initial``: the first step's token-mean entropy ``H̄``, fixed then and kept in the checkpoint."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..schema import require

INITIAL = "initial"


def require_target(target: object, path: str, *, optional: bool = False) -> None:
    """Fail naming ``path`` unless ``target`` is a number >= 0 or ``initial`` (or optional null)."""
    require(
        (optional and target is None)
        or target == INITIAL
        or (isinstance(target, float) and math.isfinite(target) and target >= 0),
        path,
        f"must be {'null, ' if optional else ''}a number >= 0 (nats) or {INITIAL!r}, "
        f"got {target!r}",
    )


class EntropyTarget:
    """``H_target``: the configured number, or ``initial`` resolved by the first batch seen."""

    def __init__(self, configured: float | str):
        self.from_first_step = configured == INITIAL
        self.value: float | None = None if self.from_first_step else float(configured)

    def resolve(self, mean_entropy: float) -> float:
        """``H_target``; an unresolved ``initial`` becomes this batch's ``H̄``."""
        if self.value is None:
            self.value = mean_entropy
        return self.value

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep: the resolved ``initial`` (a number needs nothing)."""
        return {"target_entropy": self.value} if self.from_first_step else {}

    def restore(self, state: Mapping[str, Any]) -> None:
        if "target_entropy" in state:
            value = state["target_entropy"]
            self.value = None if value is None else float(value)
