"""The NaN guard: a run stops after ``trainer.max_nan_steps`` rollout steps in a row whose update
was skipped for a non-finite loss or gradient (docs/training.md, "Errors").
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class NanStreakError(RuntimeError):
    """Too many consecutive rollout steps had a non-finite loss or gradient."""


class NanGuard:
    """Counts consecutive rollout steps with a skipped (non-finite) update; raises at ``limit``."""

    def __init__(self, limit: int):
        self.limit = limit
        self.streak = 0

    def record(self, step: int, skipped: int) -> None:
        """Log a step whose update skipped ``skipped`` optimizer steps; raise after ``limit``."""
        if not skipped:
            self.streak = 0
            return
        self.streak += 1
        log.warning(
            "step %d: %d optimizer step(s) skipped for a non-finite loss or gradient "
            "(%d rollout step(s) in a row, limit trainer.max_nan_steps=%d)",
            step,
            skipped,
            self.streak,
            self.limit,
        )
        if self.streak >= self.limit:
            raise NanStreakError(
                f"{self.streak} rollout steps in a row had a non-finite loss or gradient "
                f"(trainer.max_nan_steps={self.limit}); last at step {step}"
            )
