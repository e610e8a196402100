"""``token_stats`` inside ``deferred_checks``: the pass runs on, and the recorded verdict is the
error the immediate checks raise, word for word."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.core.deferred_checks import deferred_checks
from opefo_nemo.parallel import NonFiniteLogitsError, token_stats


def _logits() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 11, generator=generator), torch.randint(0, 11, (6,), generator=generator)


@pytest.mark.parametrize(
    "spoil, error",
    [
        (lambda logits, targets: logits[2].fill_(float("nan")), NonFiniteLogitsError),
        (lambda logits, targets: targets.__setitem__(4, 11), ValueError),
    ],
    ids=["nan-logits", "target-outside-vocabulary"],
)
def test_deferred_error_is_the_immediate_one(spoil, error):
    logits, targets = _logits()
    spoil(logits, targets)
    with pytest.raises(error) as immediate:
        token_stats(logits, targets)
    with deferred_checks() as checks:
        checks.label = "micro-batch 3"
        stats = token_stats(logits, targets)
    assert stats.logprob.shape == targets.shape  # the pass ran on
    recorded = checks.first_error()
    assert type(recorded) is error
    assert str(recorded) == f"{immediate.value} (micro-batch 3)"


def test_deferred_statistics_equal_the_immediate_ones():
    logits, targets = _logits()
    with deferred_checks() as checks:
        deferred = token_stats(logits, targets, sums=("sum_p2",))
    assert checks.first_error() is None
    immediate = token_stats(logits, targets, sums=("sum_p2",))
    for name, value in immediate.present().items():
        assert torch.equal(value, deferred.present()[name]), name
