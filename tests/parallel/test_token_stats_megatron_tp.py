"""megatron-core's real ColumnParallelLinear at TP = 2 on CPU/gloo feeding token_stats."""

from __future__ import annotations

import pytest

from tests.parallel import workers_megatron as workers
from tests.parallel.world import run_world

pytest.importorskip("megatron.core")


def test_column_parallel_weight_grads_equal_tp1() -> None:
    run_world(workers.column_parallel_grads_match, 2)
