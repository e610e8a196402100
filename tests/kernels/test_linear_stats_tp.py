"""The fused output-layer kernel over a real 2-rank gloo tensor-parallel group (interpreted on
CPU)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

from tests.kernels import workers_tp as workers
from tests.parallel.world import run_world


def test_linear_kernel_tp2_matches_full_vocabulary():
    run_world(workers.linear_kernel, 2)
