"""Global-batch reductions over real gloo groups: prepare() is the same whatever the layout."""

from __future__ import annotations

from tests.parallel import workers_batch as workers
from tests.parallel.world import run_world


def test_prepare_is_layout_independent() -> None:
    run_world(workers.prepare_is_layout_independent, 4)


def test_reducer_and_broadcast() -> None:
    run_world(workers.reducer_and_broadcast, 4)
