"""The loss closure through megatron-core 0.16.1's real no-pipelining schedule on a real GPTModel
(CPU, gloo; the few CUDA allocations redirected by ``cpu_megatron``): after one backward, the
gradients of TP 2 × DP 1, TP 1 × DP 2 and TP 2 × DP 2 with 1 or 3 responses per micro-batch,
gathered over TP, equal the TP 1, one-micro-batch reference on the same weights and batch; that
reference equals a plain full-vocabulary autograd of SPEC §5's loss; the forward-only stats
pass's logprobs equal the loss pass's."""

from __future__ import annotations

import pytest
import torch

from tests.parallel.world import run_world

from . import workers_closure
from .tiny import random_batch

pytest.importorskip("megatron.core")
ROWS = 6


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Per method: TP 1, DP 1, the whole batch as one micro-batch."""
    batch = random_batch(ROWS, workers_closure.VOCAB, seed=5)
    out = {}
    for method in ("opefo", "entropy_reg"):
        folder = tmp_path_factory.mktemp(f"reference_{method}")
        run_world(workers_closure.closure_step, 1, 1, ROWS, method, False, batch, None, str(folder))
        out[method] = folder
    return batch, out


@pytest.mark.parametrize(
    ("tp", "dp", "micro_batch_size", "method", "sequence_first"),
    [
        (2, 1, 1, "opefo", False),
        (2, 1, 3, "entropy_reg", True),
        (1, 2, 1, "opefo", True),
        (1, 2, 3, "opefo", False),
        (2, 2, 1, "opefo", True),
    ],
)
def test_gradients_equal_single_process_reference(
    reference, tmp_path, tp, dp, micro_batch_size, method, sequence_first
):
    batch, folders = reference
    expected = folders[method]
    state = torch.load(expected / "state.pt")
    run_world(
        workers_closure.closure_step,
        tp * dp,
        tp,
        micro_batch_size,
        method,
        sequence_first,
        batch,
        state,
        str(tmp_path),
    )
    got, want = torch.load(tmp_path / "grads.pt"), torch.load(expected / "grads.pt")
    assert got["n_tokens"] == want["n_tokens"] == batch.n_response_tokens
    assert got["grads"].keys() == want["grads"].keys()
    for name, grad in want["grads"].items():
        scale = float(grad.abs().max())
        assert scale > 0, name
        # Each gradient element is a sum over the batch's tokens (here ≤ 2¹⁰ terms) accumulated
        # in another order (TP-split matmuls, DP all-reduce, micro-batches): fp32 round-off of
        # at most 2¹⁰ ε₃₂ of the tensor's largest element; a wrong gradient is off by O(scale).
        atol = 1024 * torch.finfo(torch.float32).eps * scale
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=atol, msg=name)

    want_rows = torch.load(expected / "rows_dp0.pt")
    got_rows = {}
    for rank in range(dp):
        got_rows.update(torch.load(tmp_path / f"rows_dp{rank}.pt"))
    assert sorted(got_rows) == list(range(ROWS))
    for row, (stats_pass, loss_pass) in got_rows.items():
        torch.testing.assert_close(stats_pass, loss_pass, rtol=0, atol=0)
        torch.testing.assert_close(stats_pass, want_rows[row][0], rtol=1e-5, atol=1e-5)
