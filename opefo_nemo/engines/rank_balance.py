"""Dealing weighted items to data-parallel ranks so that the heaviest rank is as light as it can
be made: the Karmarkar–Karp differencing method, then swaps and moves off the heaviest rank
(docs/batch_layout.md, "How the planner works"). Pure Python, deterministic.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Sequence

_DUMMY = -1
"""An item of weight 0 that fills the last stripe of an equal-count partition."""


def karmarkar_karp(weights: Sequence[int], parts: int, equal_counts: bool) -> list[list[int]]:
    """The indices of ``weights`` in ``parts`` groups by the largest differencing method.

    Each item starts as a partial partition (the item alone in one group; with ``equal_counts``
    a stripe of ``parts`` consecutive items of the sorted order, one per group, the last stripe
    filled with weight-0 items). The two partial partitions with the largest spread
    (heaviest − lightest group) are merged, the heaviest group of one with the lightest of the
    other, until one is left. ``equal_counts``: every group gets ``⌈n / parts⌉`` or
    ``⌊n / parts⌋`` items. Ties are broken by item index; groups come heaviest first."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    if equal_counts:
        order += [_DUMMY] * (-len(order) % parts)
        seeds = [order[start : start + parts] for start in range(0, len(order), parts)]
    else:
        seeds = [[item] + [_DUMMY] * (parts - 1) for item in order]
    counter = itertools.count()
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for seed in seeds:
        groups = [(0 if i == _DUMMY else weights[i], [] if i == _DUMMY else [i]) for i in seed]
        heapq.heappush(heap, (-_spread(groups), next(counter), groups))
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        merged = [
            (load_a + load_b, items_a + items_b)
            for (load_a, items_a), (load_b, items_b) in zip(first, reversed(second), strict=True)
        ]
        merged.sort(key=lambda group: -group[0])  # stable: ties keep their order
        heapq.heappush(heap, (-_spread(merged), next(counter), merged))
    if not heap:
        return [[] for _ in range(parts)]
    return [sorted(items) for _, items in heap[0][2]]


def _spread(groups: Sequence[tuple[int, list[int]]]) -> int:
    loads = [load for load, _ in groups]
    return max(loads) - min(loads)


def improve(
    groups: list[list[int]], weights: Sequence[int], moves: bool, rounds: int | None = None
) -> list[list[int]]:
    """``groups`` with items exchanged until the heaviest group cannot be lightened: each round
    takes the heaviest group ``h`` (the first of equal ones) and, over every other group ``g``,
    the swap of an item of ``h`` for a lighter one of ``g`` (and with ``moves``, the move of an
    item of ``h`` to ``g``: counts may then change) that brings the heavier of the two new loads
    lowest; it applies it when that load is below ``h``'s. Each applied exchange replaces the
    largest load by two smaller ones, so the rounds end (at most ``rounds``, default 4 × items).
    Ties are broken by group and item index."""
    groups = [sorted(group) for group in groups]
    loads = [sum(weights[i] for i in group) for group in groups]
    limit = rounds if rounds is not None else 4 * sum(len(g) for g in groups)
    for _ in range(limit):
        heavy = loads.index(max(loads))
        best: tuple[int, int, int, int] | None = None  # (new max, group, out item, in item)
        for other, load in enumerate(loads):
            gap = loads[heavy] - load
            if other == heavy or gap <= 1:
                continue
            candidate = _best_exchange(groups[heavy], groups[other], weights, gap, moves)
            if candidate is None:
                continue
            delta, out, into = candidate
            new_max = max(loads[heavy] - delta, load + delta)
            if best is None or new_max < best[0]:
                best = (new_max, other, out, into)
        if best is None or best[0] >= loads[heavy]:
            break
        _, other, out, into = best
        delta = weights[out] - (0 if into == _DUMMY else weights[into])
        groups[heavy].remove(out)
        groups[other].append(out)
        if into != _DUMMY:
            groups[other].remove(into)
            groups[heavy].append(into)
        groups[heavy].sort()
        groups[other].sort()
        loads[heavy] -= delta
        loads[other] += delta
    return groups


def _best_exchange(
    heavy: Sequence[int], light: Sequence[int], weights: Sequence[int], gap: int, moves: bool
) -> tuple[int, int, int] | None:
    """``(delta, out, into)``: the item ``out`` of ``heavy`` and ``into`` of ``light`` (or
    ``_DUMMY``: a move) whose exchange moves ``delta`` = ``w[out] − w[into]`` in ``(0, gap)``
    closest to ``gap / 2``, the best split of the two groups' loads; ``None`` if none does."""
    by_weight = sorted((weights[i], i) for i in light)
    keys = [w for w, _ in by_weight]
    best: tuple[int, int, int, int] | None = None  # (|2·delta − gap|, delta, out, into)
    for out in heavy:
        w_out = weights[out]
        options: list[tuple[int, int]] = [(0, _DUMMY)] if moves else []
        position = bisect.bisect_left(keys, w_out - gap / 2)
        for near in (position - 1, position):
            if 0 <= near < len(by_weight):
                options.append(by_weight[near])
        for w_in, into in options:
            delta = w_out - w_in
            if 0 < delta < gap:
                score = (abs(2 * delta - gap), delta, out, into)
                if best is None or score[0] < best[0]:
                    best = score
    return None if best is None else best[1:]
