"""A pool of worker processes that score responses with a hard per-item time limit; results in
input order, independent of the number of workers (docs/rewards_data_eval.md, "Time limits").
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from opefo_nemo.rewards.function import RewardFunctionError, load_reward_function
from opefo_nemo.rewards.result import ERROR, TIMEOUT, RewardResult, ScoringConfig
from opefo_nemo.rewards.scoring import score_with_config

_PRELOAD = ["opefo_nemo.rewards.scoring", "opefo_nemo.rewards.symbolic"]
READY = "ready"
"""What a worker sends once it can score."""
START_TIMEOUT_S = 300.0
"""How long a worker may take to start (import the parent's main module, and the reward
function) before the pool gives up on it."""


def _worker_main(conn: Connection, config: ScoringConfig, import_path: list[str]) -> None:
    """Score (index, response, ground_truth) messages until a None message or a closed pipe.

    A reward function is imported first, with the parent's ``sys.path`` (``import_path``: the
    forkserver keeps the path it started with); an import that fails here fails again on each
    item, scored ``error``. Then :data:`READY` is sent: no item's time runs before it."""
    if config.function is not None:
        sys.path[:] = import_path
        with contextlib.suppress(RewardFunctionError):
            load_reward_function(config.function)
    conn.send(READY)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, response, ground_truth = message
        result = score_with_config(response, ground_truth, config)
        conn.send((index, result.score, result.answer, result.reason, dict(result.metrics)))


class _Worker:
    def __init__(self, context: Any, config: ScoringConfig):  # a multiprocessing context
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(
            target=_worker_main,
            args=(child_conn, config, list(sys.path)),
            daemon=True,
            name="opefo-reward",
        )
        self.process.start()
        child_conn.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the worker has started (a new process imports the parent's main module
        first: seconds in a trainer); raises ``RuntimeError`` if it dies or takes over
        ``timeout_s``."""
        try:
            ready = self.conn.poll(timeout_s) and self.conn.recv() == READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(
                f"a reward worker did not start within {timeout_s:.0f} s "
                f"(exit code {self.process.exitcode})"
            )

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(None)
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class RewardPool:
    """`workers` scoring processes sharing one `ScoringConfig`; use as a context manager or call
    `close()`. Keep one alive across training steps to pay the start-up cost once.

    Each worker holds one item at a time. Inside it the soft limit (`time_limit.py`) interrupts
    Python code after `config.timeout_s`; if the worker is still busy `hard_grace_s` later (a long
    C call, e.g. a huge integer power in sympy), the parent kills it, scores the item as a timeout
    and starts a replacement. Workers come from `forkserver` by default: safe in a parent running
    torch or vLLM threads. The server has the verifiers imported, but each new worker imports the
    parent's main module (seconds under `opefo-train`): an item's clock starts only when a worker
    that has reported ready takes it."""

    def __init__(
        self,
        workers: int,
        config: ScoringConfig | None = None,
        *,
        hard_grace_s: float = 1.0,
        start_method: str = "forkserver",
    ) -> None:
        if workers < 1:
            raise ValueError(f"RewardPool needs workers >= 1, got {workers}")
        if hard_grace_s < 0:
            raise ValueError(f"RewardPool hard_grace_s must be >= 0, got {hard_grace_s}")
        self.config = config if config is not None else ScoringConfig()
        self.hard_limit_s = self.config.timeout_s + hard_grace_s
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._context.set_forkserver_preload(_PRELOAD)
        self._workers = [_Worker(self._context, self.config) for _ in range(workers)]
        for worker in self._workers:  # started together, waited for in turn
            worker.wait_ready(START_TIMEOUT_S)
        self.restarts = 0

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = _Worker(self._context, self.config)
        fresh.wait_ready(START_TIMEOUT_S)
        self._workers[self._workers.index(worker)] = fresh
        self.restarts += 1
        return fresh

    def _failed(self, reason: str) -> RewardResult:
        return RewardResult(self.config.score_for(reason), None, reason)

    def score(self, responses: Sequence[str], ground_truths: Sequence[str]) -> list[RewardResult]:
        """Score `responses[i]` against `ground_truths[i]` in the workers; input order kept."""
        if not self._workers:
            raise RuntimeError("RewardPool.score called after close()")
        if len(responses) != len(ground_truths):
            raise ValueError(
                f"RewardPool.score got {len(responses)} responses "
                f"but {len(ground_truths)} ground truths"
            )
        results: list[RewardResult | None] = [None] * len(responses)
        pending = deque(range(len(responses)))
        idle = list(self._workers)
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        while pending or busy:
            while idle and pending:
                worker, index = idle.pop(), pending.popleft()
                try:
                    worker.conn.send((index, responses[index], ground_truths[index]))
                except (BrokenPipeError, OSError):
                    results[index] = self._failed(ERROR)
                    idle.append(self._replace(worker))
                    continue
                busy[worker.conn] = (worker, index, time.monotonic() + self.hard_limit_s)
            if not busy:
                continue
            next_deadline = min(deadline for _, _, deadline in busy.values())
            ready = wait(list(busy), timeout=max(0.0, next_deadline - time.monotonic()))
            for conn in cast("list[Connection]", ready):  # wait returns what it was given
                worker, index, _ = busy.pop(conn)
                try:
                    _, value, answer, reason, metrics = conn.recv()
                except (EOFError, OSError):
                    results[index] = self._failed(ERROR)
                    idle.append(self._replace(worker))
                    continue
                results[index] = RewardResult(value, answer, reason, metrics)
                idle.append(worker)
            now = time.monotonic()
            for conn, (worker, index, deadline) in list(busy.items()):
                if now >= deadline:
                    del busy[conn]
                    results[index] = self._failed(TIMEOUT)
                    idle.append(self._replace(worker))
        return [result for result in results if result is not None]
