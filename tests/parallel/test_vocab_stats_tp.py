"""The vocabulary sums for the ΔH estimators over real gloo TP groups (4 ranks; TP 1, 2, 4)."""

from __future__ import annotations

from tests.parallel import workers_vocab_sums as workers
from tests.parallel.world import run_world


def test_sums_and_expectation_estimator_match_brute_force_at_tp_1_2_4() -> None:
    run_world(workers.sums_match_brute_force, 4)


def test_all_reduce_payload_follows_the_request() -> None:
    run_world(workers.payload_follows_the_request, 2)
