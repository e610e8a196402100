"""What the loop needs from a rollout engine (docs/architecture.md, Protocols); the training
engine's protocol is :class:`opefo_nemo.engines.protocols.Policy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class RolloutEngine(Protocol):
    """Generation service (``opefo_nemo.rollout``); completions come back prompt-major."""

    def generate(self, prompts: list[list[int]], n: int, sampling) -> list: ...

    def update_weights(self, named_weights: Iterable[tuple[str, Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake(self, tags: Sequence[str] | None = None) -> None: ...

    def close(self) -> None: ...
