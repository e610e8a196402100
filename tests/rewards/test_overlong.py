"""DAPO's overlong shaping against its piecewise definition, enumerated over small lengths."""

from __future__ import annotations

import pytest

from opefo_nemo.rewards import overlong_penalty


def _piecewise(length: int, max_length: int, buffer: int, factor: float) -> float:
    """0 up to max_length − buffer tokens, then −factor / buffer per token beyond it."""
    free = max_length - buffer
    return 0.0 if length <= free else -factor * (length - free) / buffer


@pytest.mark.parametrize("factor", [1.0, 0.5, 2.0])
def test_penalty_matches_the_piecewise_definition(factor: float) -> None:
    for max_length in range(1, 13):
        for buffer in range(1, max_length + 1):
            for length in range(0, max_length + 1):
                got = overlong_penalty(length, max_length, buffer, factor)
                assert got == pytest.approx(_piecewise(length, max_length, buffer, factor))
            assert overlong_penalty(max_length, max_length, buffer, factor) == -factor


def test_no_buffer_means_no_shaping() -> None:
    assert all(overlong_penalty(n, 8, 0) == 0.0 for n in range(0, 20))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(3, 8, -1)
    with pytest.raises(ValueError, match="factor"):
        overlong_penalty(3, 8, 2, -0.5)
    with pytest.raises(ValueError, match="exceeds"):
        overlong_penalty(3, 8, 9)
