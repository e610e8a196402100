"""The Triton kernels compiled on a GPU (``tests/kernels`` checks their logic in Triton's
interpreter on CPU tensors): both kernels, fp32 and bf16, statistics and gradients against float64
within the bounds of ``tests/kernels/tolerances.py`` (``workers_kernels.py``). Skipped without
CUDA or Triton.

The checks run in a process of their own with ``TRITON_INTERPRET=0``: a kernel module compiles or
interprets for the life of the process that imports it, and ``tests/kernels`` turns the
interpreter on at collection.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA (README.md)", allow_module_level=True)
pytest.importorskip("triton")

from tests.parallel.world import run_world

from . import workers_kernels


def test_compiled_kernels_match_float64():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "0")
        run_world(workers_kernels.compiled_kernels, 1, "cuda")
