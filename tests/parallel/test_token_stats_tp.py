"""token_stats over real multi-process gloo TP groups (4 ranks; TP 1, 2, 4)."""

from __future__ import annotations

from tests.parallel import workers_token_stats as workers
from tests.parallel.world import run_world


def test_tp_layouts_match_full_vocabulary_reference() -> None:
    run_world(workers.stats_match_reference, 4)


def test_bad_input_fails_every_rank() -> None:
    run_world(workers.errors_fail_every_rank, 2)


def test_failing_rank_does_not_hang() -> None:
    run_world(workers.failing_rank_does_not_hang, 2)
