"""A soft, in-process time limit for one verification (`SIGALRM`: main thread only, Python code
only); the worker pool (`pool.py`) adds the hard limit (docs/rewards_data_eval.md, "Time limits").
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class VerificationTimeout(BaseException):
    """Raised inside a verification that ran past its time limit.

    A `BaseException`, so that the `except Exception` blocks inside math-verify and sympy do
    not swallow it.
    """


def can_interrupt() -> bool:
    """Whether `time_limit` can interrupt here (the main thread of a POSIX process)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `VerificationTimeout` in the body once `seconds` of wall time have passed. It arms
    `SIGALRM` through `signal.setitimer`, so it only interrupts Python code: a single C call (a
    huge integer power inside sympy) runs on until it returns.

    Outside the main thread this is a no-op (no signal can be delivered there). Any timer and
    handler that were set before are restored on exit.
    """
    if not can_interrupt():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise VerificationTimeout(f"verification exceeded {seconds} s")

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)
