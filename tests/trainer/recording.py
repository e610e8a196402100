"""A pass-through wrapper around a real rollout engine that records the calls the trainer makes
and the completions it received (no behaviour of its own: every call goes to the engine)."""

from __future__ import annotations

from collections.abc import Sequence


class RecordingRollout:
    """Forwards to ``engine``; ``calls`` lists ``generate``, ``sleep``, ``update_weights`` and
    ``("wake", tags)`` in order, ``completions`` everything ``generate`` returned."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list = []
        self.completions: list = []

    @property
    def restarts(self) -> int:
        return self.engine.restarts

    def generate(self, prompts, n, sampling):
        self.calls.append("generate")
        completions = self.engine.generate(prompts, n, sampling)
        self.completions += completions
        return completions

    def update_weights(self, named_weights) -> None:
        self.calls.append("update_weights")
        self.engine.update_weights(named_weights)

    def sleep(self) -> None:
        self.calls.append("sleep")
        self.engine.sleep()

    def wake(self, tags: Sequence[str] | None = None) -> None:
        self.calls.append(("wake", None if tags is None else tuple(tags)))
        self.engine.wake(tags)

    def close(self) -> None:
        self.engine.close()
