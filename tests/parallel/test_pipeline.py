"""Over a real gloo pipeline: the per-token statistics broadcast from the last stage
(``parallel/pipeline.py``) reach every stage."""

from __future__ import annotations

from tests.parallel import workers_batch as workers
from tests.parallel.world import run_world


def test_broadcast_from_the_last_stage() -> None:
    run_world(workers.broadcast_reaches_every_stage, 4)
