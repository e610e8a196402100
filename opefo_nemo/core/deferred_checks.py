"""Input checks kept on the device for a whole pass and read once at its end, so that no
check makes the host wait for the device per micro-batch (docs/performance.md, "Host
synchronisations counted on the CPU").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class _Check:
    count: Tensor  # 0-d int64 on the device: how many values fail
    error: Callable[[], Exception]  # builds the error (reads the device: called only on failure)
    label: str


class DeferredChecks:
    """The checks recorded in one pass, in the order they ran."""

    def __init__(self) -> None:
        self._checks: list[_Check] = []
        self.label = ""
        """Added to the message of checks recorded from now on (``"micro-batch 3"``)."""

    def record(self, count: Tensor, error: Callable[[], Exception]) -> None:
        """A check that failed ``count`` times (a device tensor; no host read here)."""
        self._checks.append(_Check(count.detach().reshape(()).long(), error, self.label))

    def first_error(self) -> Exception | None:
        """The error of the first recorded check that failed, or ``None``: one host read."""
        if not self._checks:
            return None
        counts = torch.stack([check.count for check in self._checks]).tolist()
        for check, count in zip(self._checks, counts, strict=True):
            if count:
                error = check.error()
                if check.label:
                    error.args = (f"{error.args[0]} ({check.label})", *error.args[1:])
                return error
        return None


_ACTIVE: ContextVar[DeferredChecks | None] = ContextVar("deferred_checks", default=None)


@contextmanager
def deferred_checks() -> Iterator[DeferredChecks]:
    """Record the checks run inside the block instead of raising; read them with
    :meth:`DeferredChecks.first_error` after it.

    On a GPU a check that decides in Python whether to raise (``bool(t.any())``) makes the host
    wait for the device. Inside the block the checks of :mod:`.tensor_checks` and of
    ``parallel.token_stats`` record a device count of offending values and a way to build their
    error; ``first_error`` reads every count in one transfer and returns the error the first
    failing check would have raised, with its message and the label current when it was recorded
    (e.g. the micro-batch). Outside the block the checks raise at once."""
    checks = DeferredChecks()
    token = _ACTIVE.set(checks)
    try:
        yield checks
    finally:
        _ACTIVE.reset(token)


def active_checks() -> DeferredChecks | None:
    """The innermost :func:`deferred_checks` block's record, ``None`` outside one."""
    return _ACTIVE.get()
