"""Checks deferred to the end of a pass: the same errors as the immediate checks, the first
failing one in program order, labelled, and no host read before :meth:`first_error`."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.core.deferred_checks import deferred_checks
from opefo_nemo.core.tensor_checks import check_finite
from tests.host_syncs import count_host_syncs


def _immediate(name: str, tensor: torch.Tensor) -> str:
    with pytest.raises(ValueError) as raised:
        check_finite(name, tensor)
    return str(raised.value)


def test_the_first_failing_check_raises_the_immediate_message_with_its_label():
    fine = torch.ones(3)
    bad = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]])
    worse = torch.full((2,), float("nan"))
    with deferred_checks() as checks:
        checks.label = "micro-batch 0"
        check_finite("logprob", fine)
        checks.label = "micro-batch 1"
        check_finite("logprob", bad)
        check_finite("advantages", worse)
    error = checks.first_error()
    assert isinstance(error, ValueError)
    assert str(error) == f"{_immediate('logprob', bad)} (micro-batch 1)"
    assert "2 non-finite value(s)" in str(error) and "first at index (0, 1)" in str(error)


def test_nothing_failing_gives_none_and_checks_outside_the_block_raise_at_once():
    with deferred_checks() as checks:
        check_finite("logprob", torch.zeros(4))
    assert checks.first_error() is None
    with deferred_checks() as empty:
        pass
    assert empty.first_error() is None
    with pytest.raises(ValueError, match="advantages has 1 non-finite"):
        check_finite("advantages", torch.tensor([0.0, float("-inf")]))


def test_recording_reads_nothing_and_the_verdict_is_one_read():
    """On a GPU: the checks of a whole pass cost one host synchronisation, at its end."""
    values = [torch.randn(5) for _ in range(4)]

    def record():
        with deferred_checks() as checks:
            for value in values:
                check_finite("logprob", value)
        return checks

    recorded, checks = count_host_syncs([], record)
    assert not recorded, recorded
    read, error = count_host_syncs([], checks.first_error)
    assert error is None
    assert sum(read.values()) == 1 and next(iter(read))[0] == "read", read
