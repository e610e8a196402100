"""Over real gloo groups: prepare() of vocab-parallel statistics is the same whatever the TP
layout, and its reweighting metrics and STEER's weights at TP 2 × DP 2 equal one process's."""

from __future__ import annotations

from tests.parallel import workers_batch as workers
from tests.parallel.world import run_world


def test_prepare_is_layout_independent() -> None:
    run_world(workers.prepare_is_layout_independent, 4)


def test_reweighting_metrics_at_tp2_dp2_equal_one_process() -> None:
    run_world(workers.reweighting_metrics_at_tp2_dp2, 4)


def test_steer_batch_scope_weights_at_tp2_dp2_equal_one_process() -> None:
    run_world(workers.steer_weights_at_tp2_dp2, 4)
