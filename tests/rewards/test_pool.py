"""score_batch / RewardPool: worker processes give the in-process results, in order, and a
pathological item hits its time limit without holding up the batch."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from opefo_nemo.rewards import RewardPool, ScoringConfig, score_batch
from tests.rewards.cases import CASES

PATHOLOGICAL = "$\\boxed{10^{10^{10}}}$"
#: The time limit: the pathological item never finishes; 3 s leaves an ordinary one (milliseconds
#: alone) room on a loaded machine, where 1 s timed one out on a rerun.
CONFIG = ScoringConfig(verifier="math_verify", timeout_s=3.0)


@pytest.fixture(scope="module")
def pool() -> Iterator[RewardPool]:
    with RewardPool(2, CONFIG) as running:
        yield running


def _batch() -> tuple[list[object], list[str]]:
    responses: list[object] = [case[1] for case in CASES]
    truths = [case[2] for case in CASES]
    responses[5:5] = [PATHOLOGICAL, None]
    truths[5:5] = ["5", "3"]
    return responses, truths


def _stuck_pool(hard_grace_s: float) -> RewardPool:
    """One forked worker that inherits SIGALRM blocked (its 0.5 s soft limit never fires, as in a
    long C call): only the hard limit, ``0.5 + hard_grace_s``, or its death ends an item."""
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        return RewardPool(
            1,
            ScoringConfig(verifier="math_verify", timeout_s=0.5),
            hard_grace_s=hard_grace_s,
            start_method="fork",
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def test_pool_matches_in_process_scoring_in_order(pool: RewardPool) -> None:
    responses, truths = _batch()
    expected = score_batch(responses, truths, config=CONFIG, workers=0)  # type: ignore[arg-type]
    started = time.monotonic()
    got = pool.score(responses, truths)  # type: ignore[arg-type]
    elapsed = time.monotonic() - started
    assert got == expected
    assert got[5].reason == "timeout" and got[5].score == 0.0
    assert got[6].reason == "error"
    assert elapsed < 2 * (CONFIG.timeout_s + 1.0) + 5.0
    assert pool.score(responses, truths) == got  # deterministic on a rerun  # type: ignore[arg-type]


def test_score_batch_with_workers_matches_in_process() -> None:
    responses = ["Answer: 3", "Answer: \\frac12", "nothing", "Answer: 1,000"]
    truths = ["3", "0.5", "1", "1000"]
    in_process = score_batch(responses, truths, verifier="dapo")
    assert [r.reason for r in in_process] == ["correct", "wrong", "no_answer", "correct"]
    assert score_batch(responses, truths, verifier="dapo", workers=2) == in_process


def test_hard_limit_kills_a_worker_stuck_outside_python() -> None:
    """With SIGALRM blocked in the workers the soft limit cannot fire (as in a long C call):
    the parent must kill the worker at timeout_s + hard_grace_s and go on."""
    with _stuck_pool(hard_grace_s=0.5) as running:
        started = time.monotonic()
        results = running.score([PATHOLOGICAL, "$\\boxed{5}$"], ["5", "5"])
        elapsed = time.monotonic() - started
        assert [r.reason for r in results] == ["timeout", "correct"]
        assert running.restarts == 1
        assert 0.9 < elapsed < 10.0


def _kill(pool: RewardPool) -> None:
    """Kill the pool's only worker process, as the OOM killer or a segfault would."""
    process = pool._workers[0].process
    process.kill()
    process.join()


def test_a_worker_found_dead_is_replaced_and_its_item_scored_as_an_error() -> None:
    with RewardPool(1, ScoringConfig(verifier="dapo"), start_method="fork") as running:
        _kill(running)  # the pipe's other end is gone: sending the first item fails
        results = running.score(["Answer: 3", "Answer: 4"], ["3", "3"])
        assert [r.reason for r in results] == ["error", "wrong"]
        assert running.restarts == 1


def test_a_worker_dying_while_scoring_is_replaced_before_its_time_limit() -> None:
    """The worker is stuck outside Python (SIGALRM blocked) with a 60 s hard limit and dies after
    1 s: its pipe's end of file fails the item at once, and the next item goes to a new worker."""
    with _stuck_pool(hard_grace_s=60.0) as running:
        killer = threading.Timer(1.0, _kill, args=(running,))
        killer.start()
        started = time.monotonic()
        results = running.score([PATHOLOGICAL, "$\\boxed{5}$"], ["5", "5"])
        elapsed = time.monotonic() - started
        killer.join()
        assert [r.reason for r in results] == ["error", "correct"]
        assert running.restarts == 1
        assert elapsed < 30.0


def test_batch_argument_errors() -> None:
    with pytest.raises(ValueError, match="2 responses but 1 ground truths"):
        score_batch(["a", "b"], ["1"])
    with pytest.raises(TypeError, match=r"ground_truths\[1\]"):
        score_batch(["a", "b"], ["1", 2])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="workers"):
        score_batch(["a"], ["1"], workers=-1)
