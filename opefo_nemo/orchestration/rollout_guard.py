"""A rollout engine that survives a server death: restart it, reload the weights and retry, at most
``max_restarts`` times in a run, then fail clearly (docs/rollout.md, "Robustness").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

from torch import Tensor

from opefo_nemo.orchestration.protocols import RolloutEngine
from opefo_nemo.rollout import Completion, RolloutServerError, SamplingConfig
from opefo_nemo.rollout.protocol import ProtocolError

log = logging.getLogger(__name__)
TRANSPORT_FAILURES = (RolloutServerError, ProtocolError, TimeoutError, ConnectionError)
"""Errors meaning the server, not the request, failed: worth a restart."""


class GuardedRollout:
    """Wraps the engine made by ``factory``; ``weights()`` yields the policy's current weights. A
    transport failure (dead server process, timeout, closed connection) closes a
    ``VLLMRolloutEngine``; the guard then starts a fresh engine, loads the current weights into
    it and retries the request. After ``max_restarts`` restarts the next failure is a
    ``RuntimeError`` that says what happened."""

    def __init__(
        self,
        factory: Callable[[], RolloutEngine],
        weights: Callable[[], Iterator[tuple[str, Tensor]]],
        max_restarts: int,
    ):
        self.factory = factory
        self.weights = weights
        self.max_restarts = max_restarts
        self.restarts = 0
        self.engine = factory()

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[Completion]:
        try:
            return self.engine.generate(prompts, n, sampling)
        except TRANSPORT_FAILURES as error:
            self._restart(error)
        try:
            return self.engine.generate(prompts, n, sampling)
        except TRANSPORT_FAILURES as error:
            raise RuntimeError(
                f"the rollout engine failed again right after a restart: {error}"
            ) from error

    def update_weights(self, named_weights: Iterable[tuple[str, Tensor]]) -> None:
        try:
            self.engine.update_weights(named_weights)
        except TRANSPORT_FAILURES as error:
            self._restart(error)

    def sleep(self) -> None:
        """Free the servers' GPU memory while the policy trains (a restarted server is awake)."""
        try:
            self.engine.sleep()
        except TRANSPORT_FAILURES as error:
            self._restart(error)

    def wake(self, tags: Sequence[str] | None = None) -> None:
        """Wake the memory ``tags`` name (``None``: all); a restarted server is awake."""
        try:
            self.engine.wake(tags)
        except TRANSPORT_FAILURES as error:
            self._restart(error)

    def _restart(self, error: Exception) -> None:
        if self.restarts >= self.max_restarts:
            raise RuntimeError(
                f"the rollout engine failed ({error}) and has already been restarted "
                f"{self.restarts} time(s) (rollout.max_restarts={self.max_restarts}); giving up"
            ) from error
        self.restarts += 1
        log.warning(
            "rollout engine failed (%s); restarting it (%d/%d)",
            error,
            self.restarts,
            self.max_restarts,
        )
        self.engine.close()
        self.engine = self.factory()
        self.engine.update_weights(self.weights())

    def close(self) -> None:
        self.engine.close()
