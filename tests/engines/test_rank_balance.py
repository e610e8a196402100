"""Dealing weighted items to ranks: Karmarkar–Karp's partition and the exchanges that lighten its
heaviest group, against their guarantees and a brute-force optimum."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opefo_nemo.engines.rank_balance import improve, karmarkar_karp


def loads(groups, weights) -> list[int]:
    return [sum(weights[i] for i in group) for group in groups]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 1000), max_size=30), st.integers(1, 6), st.booleans())
def test_every_item_once_and_the_spread_within_the_largest_item(weights, parts, equal_counts):
    """Differencing never widens a spread (largest group with smallest), so the heaviest and
    lightest groups differ by at most the largest initial spread: one item's weight, or with
    equal counts one stripe's range."""
    groups = karmarkar_karp(weights, parts, equal_counts)
    assert len(groups) == parts
    assert sorted(i for g in groups for i in g) == list(range(len(weights)))
    spread = max(loads(groups, weights)) - min(loads(groups, weights))
    assert spread <= max(weights, default=0)
    if equal_counts:
        assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert karmarkar_karp(weights, parts, equal_counts) == groups


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=9), st.integers(2, 3), st.booleans())
def test_exchanges_lighten_the_heaviest_group_towards_the_optimum(weights, parts, moves):
    start = karmarkar_karp(weights, parts, equal_counts=not moves)
    better = improve([list(g) for g in start], weights, moves)
    assert sorted(i for g in better for i in g) == list(range(len(weights)))
    assert max(loads(better, weights)) <= max(loads(start, weights))
    if not moves:
        assert sorted(map(len, better)) == sorted(map(len, start))
    # no single exchange with the heaviest group lowers it any more
    heavy = loads(better, weights).index(max(loads(better, weights)))
    for other, group in enumerate(better):
        if other == heavy:
            continue
        for out in better[heavy]:
            for into in [*group, *([None] if moves else [])]:
                delta = weights[out] - (0 if into is None else weights[into])
                pair = max(
                    loads(better, weights)[heavy] - delta, loads(better, weights)[other] + delta
                )
                assert pair >= max(loads(better, weights)) or delta <= 0


def test_exchanges_reach_the_optimum_of_a_bad_start():
    weights = [5, 4, 1, 1]
    assert sorted(loads(improve([[0, 1], [2, 3]], weights, moves=False), weights)) == [5, 6]
    assert max(loads(improve([[0, 1, 2, 3], []], weights, moves=True), weights)) == 6
    best = min(
        max(sum(weights[i] for i in side), sum(weights) - sum(weights[i] for i in side))
        for size in range(5)
        for side in itertools.combinations(range(4), size)
    )
    assert best == 6


def test_no_items_and_bad_parts():
    assert karmarkar_karp([], 3, equal_counts=False) == [[], [], []]
    with pytest.raises(ValueError, match="parts must be >= 1"):
        karmarkar_karp([1], 0, equal_counts=False)
