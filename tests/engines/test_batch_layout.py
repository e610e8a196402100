"""The batch-layout planner (docs/batch_layout.md): every row once, mini-batches kept, the budget
respected, ``contiguous`` the consecutive layout, ``balanced`` never slower than it and at least
as balanced as a plain Karmarkar–Karp deal, attention weighed where asked; the spec §11 metrics
against a count of padded positions and of attention scores."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opefo_nemo.engines.batch_layout import (
    MicroBatchCut,
    MicroBatchLayout,
    candidate_layouts,
    concatenated,
    dp_imbalance,
    pad_fraction,
    plan_layouts,
    rank_work,
)
from opefo_nemo.engines.rank_balance import karmarkar_karp


@st.composite
def plans(draw):
    """Lengths and planner settings: mini-batches of a few rows, some ranks, a budget or not."""
    mini_batches = draw(st.integers(1, 3))
    rows = mini_batches * draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(1, 60), min_size=rows, max_size=rows))
    budget = draw(st.one_of(st.none(), st.integers(1, 250)))
    return lengths, {
        "mini_batches": mini_batches,
        "data_parallel": draw(st.integers(1, 4)),
        "micro_batch_size": draw(st.integers(1, 4)),
        "max_tokens": budget,
        "multiple": draw(st.sampled_from([1, 2, 4])),
        "attention_width": draw(st.one_of(st.none(), st.integers(1, 200))),
    }


def widths(layout: MicroBatchLayout, lengths, multiple) -> list[int]:
    return [-(-max(lengths[r] for r in rows) // multiple) * multiple for rows in layout.rows]


@settings(max_examples=300, deadline=None)
@given(plans(), st.sampled_from(["balanced", "contiguous"]))
def test_every_row_once_within_its_mini_batch_and_the_budget(plan, layout):
    lengths, keys = plan
    layouts = plan_layouts(lengths, layout=layout, **keys)
    size = len(lengths) // keys["mini_batches"]
    assert len(layouts) == keys["mini_batches"]
    for j, part in enumerate(layouts):
        assert sorted(part.flat_rows) == list(range(j * size, (j + 1) * size))
        assert part.data_parallel == keys["data_parallel"]
        assert list(part.owners) == sorted(part.owners)
        assert all(list(rows) == sorted(rows) for rows in part.rows)
        for rows, width in zip(part.rows, widths(part, lengths, keys["multiple"]), strict=True):
            if keys["max_tokens"] is None:
                assert len(rows) <= keys["micro_batch_size"]
            elif len(rows) > 1:  # a row wider than the budget runs alone
                assert len(rows) * width <= keys["max_tokens"]
    assert plan_layouts(lengths, layout=layout, **keys) == layouts  # deterministic


@settings(max_examples=300, deadline=None)
@given(plans())
def test_balanced_is_never_slower_than_contiguous(plan):
    """The slowest rank of each mini-batch holds at most the contiguous layout's slowest rank's
    work; with micro_batch_size each rank runs as many micro-batches as there."""
    lengths, keys = plan
    balanced = plan_layouts(lengths, layout="balanced", **keys)
    contiguous = plan_layouts(lengths, layout="contiguous", **keys)
    work = {"multiple": keys["multiple"], "attention_width": keys["attention_width"]}
    for ours, theirs in zip(balanced, contiguous, strict=True):
        assert max(rank_work(ours, lengths, **work)) <= max(rank_work(theirs, lengths, **work))
        if keys["max_tokens"] is None:
            assert len(ours.rows) == len(theirs.rows)
            counts = [len(ours.of_rank(r)) for r in range(ours.data_parallel)]
            assert sorted(counts) == sorted(
                len(theirs.of_rank(r)) for r in range(ours.data_parallel)
            )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 100), min_size=1, max_size=24),
    st.integers(1, 5),
    st.sampled_from([1, 2, 4]),
)
def test_one_row_per_micro_batch_is_at_least_as_balanced_as_contiguous_and_karmarkar_karp(
    lengths, ranks, multiple
):
    """Without padding between rows (one row per micro-batch) every layout computes the same
    positions, so a lighter slowest rank is a lower ``perf/dp_imbalance``: ``balanced``'s is at
    most the contiguous layout's and that of the rows dealt by plain Karmarkar–Karp (equal
    counts, as ``micro_batch_size`` keeps them)."""
    (ours,) = plan_layouts(lengths, data_parallel=ranks, multiple=multiple)
    (theirs,) = plan_layouts(lengths, data_parallel=ranks, multiple=multiple, layout="contiguous")
    padded = [-(-n // multiple) * multiple for n in lengths]
    dealt = karmarkar_karp(padded, ranks, equal_counts=True)
    plain_kk = max(sum(padded[i] for i in group) for group in dealt) * ranks / sum(padded)
    imbalance = dp_imbalance([ours], lengths, multiple)
    assert imbalance <= dp_imbalance([theirs], lengths, multiple)
    assert imbalance <= plain_kk


def test_balanced_reaches_the_best_deal_of_small_batches():
    """Against every equal-count deal of 8 rows to 2 and 4 ranks (brute force): ``balanced``
    finds the lightest slowest rank more often than plain Karmarkar–Karp (38 and 34 of the 40
    cases), never a heavier one."""
    gen = torch.Generator().manual_seed(0)
    found, kk_found, cases = 0, 0, 0
    for _ in range(20):
        lengths = torch.randint(1, 100, (8,), generator=gen).tolist()
        for ranks in (2, 4):
            best = min(
                max(sum(lengths[i] for i in deal[r::ranks]) for r in range(ranks))
                for deal in itertools.permutations(range(8))
                if deal[0] == 0  # rank labels are interchangeable
            )
            (ours,) = plan_layouts(lengths, data_parallel=ranks)
            kk = karmarkar_karp(lengths, ranks, equal_counts=True)
            kk_max = max(sum(lengths[i] for i in group) for group in kk)
            ours_max = max(rank_work(ours, lengths))
            assert best <= ours_max <= kk_max
            found += ours_max == best
            kk_found += kk_max == best
            cases += 1
    assert found > kk_found and found >= 0.9 * cases, (found, kk_found, cases)


def test_contiguous_is_the_consecutive_layout():
    """Micro-batches of ``micro_batch_size`` consecutive rows within each mini-batch, micro-batch
    ``i`` of ``M`` run by rank ``⌊i·D/M⌋``: ``TrainBatch.split`` and the megatron engine's
    equal contiguous blocks."""
    lengths = list(range(1, 25))
    layouts = plan_layouts(
        lengths, mini_batches=2, data_parallel=2, micro_batch_size=3, layout="contiguous"
    )
    assert [part.rows for part in layouts] == [
        ((0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)),
        ((12, 13, 14), (15, 16, 17), (18, 19, 20), (21, 22, 23)),
    ]
    assert [part.owners for part in layouts] == [(0, 0, 1, 1), (0, 0, 1, 1)]
    (uneven,) = plan_layouts([5] * 7, data_parallel=3, micro_batch_size=2, layout="contiguous")
    assert uneven.rows == ((0, 1), (2, 3), (4, 5), (6,))
    assert uneven.owners == (0, 0, 1, 2)


def test_a_budget_cuts_sorted_rows_and_runs_a_wider_row_alone():
    lengths = [10, 3, 30, 4, 9, 2]
    (part,) = plan_layouts(lengths, micro_batch_size=1, max_tokens=20)
    assert part.rows == ((2,), (0, 4), (1, 3, 5))  # 30 alone; 2 × 10; 3 × 4
    (contiguous,) = plan_layouts(lengths, max_tokens=20, layout="contiguous")
    assert contiguous.rows == ((0, 1), (2,), (3, 4), (5,))  # 2 × 10, 30, 2 × 9, 2


def test_metrics_against_a_count_of_padded_positions():
    """Each micro-batch laid out as its ``[rows, width]`` attention mask: padding is what the
    masks leave out, a rank's work its masks' positions; the slowest rank of each pass waits."""
    gen = torch.Generator().manual_seed(1)
    for multiple in (1, 2, 4):
        lengths = torch.randint(1, 40, (24,), generator=gen).tolist()
        for keys in ({"micro_batch_size": 3}, {"max_tokens": 90}):
            layouts = plan_layouts(
                lengths, mini_batches=2, data_parallel=3, multiple=multiple, **keys
            )
            passes = [concatenated(layouts), layouts[1], *layouts]
            padded = real = 0
            slowest = mean = 0.0
            for layout in passes:
                work = [0] * layout.data_parallel
                for rows, owner in zip(layout.rows, layout.owners, strict=True):
                    width = max(lengths[r] for r in rows)
                    width += -width % multiple
                    mask = (
                        torch.arange(width)[None, :]
                        < torch.tensor([lengths[r] for r in rows])[:, None]
                    )
                    padded += int((~mask).sum())
                    real += int(mask.sum())
                    work[owner] += mask.numel()
                slowest += max(work)
                mean += sum(work) / len(work)
            assert pad_fraction(passes, lengths, multiple) == pytest.approx(
                padded / (padded + real), rel=1e-12
            )
            assert dp_imbalance(passes, lengths, multiple) == pytest.approx(
                slowest / mean, rel=1e-12
            )


def test_metrics_with_attention_against_a_count_of_scores():
    """With ``attention_width`` ``A`` a sequence of width ``w`` costs ``A`` per position (its
    linear layers) plus one per entry of its ``[w, w]`` attention scores: padding is what the
    real rows' own ``[l, l]`` scores and ``l`` positions leave out."""
    gen = torch.Generator().manual_seed(2)
    lengths = torch.randint(1, 60, (24,), generator=gen).tolist()
    for attention in (1, 25, 400):
        layouts = plan_layouts(
            lengths, mini_batches=2, data_parallel=3, max_tokens=150, attention_width=attention
        )
        passes = [concatenated(layouts), layouts[1], *layouts]
        total = real = 0
        slowest = mean = 0.0
        for layout in passes:
            work = [0] * layout.data_parallel
            for rows, owner in zip(layout.rows, layout.owners, strict=True):
                width = max(lengths[r] for r in rows)
                scores = torch.ones(len(rows), width, width)
                work[owner] += attention * len(rows) * width + scores.numel()
                real += sum(
                    attention * lengths[r] + torch.ones(lengths[r], lengths[r]).numel()
                    for r in rows
                )
            total += sum(work)
            slowest += max(work)
            mean += sum(work) / len(work)
        assert pad_fraction(passes, lengths, 1, attention) == pytest.approx(
            (total - real) / total, rel=1e-12
        )
        assert dp_imbalance(passes, lengths, 1, attention) == pytest.approx(
            slowest / mean, rel=1e-12
        )
        assert pad_fraction(passes, lengths, 1, attention) != pad_fraction(passes, lengths)


def test_weighing_attention_balances_long_rows_against_short_ones():
    """A token budget packs short rows many to a micro-batch and runs long ones alone: ranks
    balanced by positions give the rank of the longest rows more attention work. Balanced by
    the work with attention (``A`` = 300, a 4B model's 24,640 scaled to rows of at most 400
    tokens), ``perf/dp_imbalance`` with attention is lower on each of 5 draws (here 1.12–1.23
    against at most 1.002)."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        lengths = torch.exp(torch.randn(128, generator=gen) * 0.9 + 4.4).clamp(1, 400)
        lengths = lengths.round().int().tolist()
        keys = {"data_parallel": 8, "max_tokens": 450}
        (by_positions,) = plan_layouts(lengths, **keys)
        (by_work,) = plan_layouts(lengths, attention_width=300, **keys)
        flops = [dp_imbalance([layout], lengths, 1, 300) for layout in (by_positions, by_work)]
        assert flops[1] < flops[0], flops


def test_metrics_of_a_small_layout_by_hand():
    lengths = [3, 1, 2, 2]
    layout = MicroBatchLayout(((0, 1), (2, 3)), (0, 1), 2)
    # micro-batch 0: 2 × 3 positions, 2 padded; micro-batch 1: 2 × 2, none padded
    assert pad_fraction([layout], lengths) == 2 / 10
    assert dp_imbalance([layout], lengths) == 6 / 5
    assert dp_imbalance([MicroBatchLayout(((0, 1, 2, 3),), (0,), 1)], lengths) == 1.0
    # two passes, each waiting for another rank: the sum of the maxima, not the max of the sums
    swapped = MicroBatchLayout(((2, 3), (0, 1)), (0, 1), 2)
    assert dp_imbalance([layout, swapped], lengths) == 12 / 10


def test_concatenated_keeps_each_ranks_micro_batches_in_order():
    first = MicroBatchLayout(((0,), (1,), (2,)), (0, 0, 1), 2)
    second = MicroBatchLayout(((3,), (4,)), (0, 1), 2)
    joined = concatenated([first, second])
    assert joined.rows == ((0,), (1,), (3,), (2,), (4,))
    assert joined.owners == (0, 0, 0, 1, 1)
    assert joined.shifted(-1).rows[0] == (-1,) and joined.covers(5) and not first.covers(4)
    with pytest.raises(ValueError, match="one data-parallel size"):
        concatenated([first, MicroBatchLayout(((3,),), (0,), 1)])


@pytest.mark.parametrize(
    ("rows", "owners", "size", "message"),
    [
        (((0,),), (0, 0), 1, "owners for"),
        (((0,), (1,)), (1, 0), 2, "non-decreasing"),
        (((0,),), (2,), 2, "outside ranks"),
        (((0,), ()), (0, 0), 1, "without rows"),
        (((0,), (0,)), (0, 0), 1, "two micro-batches"),
        (((0,),), (0,), 0, "data_parallel"),
    ],
)
def test_a_malformed_layout_is_refused(rows, owners, size, message):
    with pytest.raises(ValueError, match=message):
        MicroBatchLayout(rows, owners, size)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"mini_batches": 4}, "equal mini-batches"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"multiple": 0}, "multiple"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"layout": "sorted"}, "not one of"),
    ],
)
def test_bad_planner_arguments_fail_naming_them(keys, message):
    with pytest.raises(ValueError, match=message):
        plan_layouts([3, 4, 5, 6, 7, 8], **keys)
    with pytest.raises(ValueError, match="at least one token"):
        plan_layouts([3, 0])


def test_the_candidates_end_with_the_contiguous_layout():
    lengths = [7, 1, 6, 2, 5, 3, 4, 4]
    cut = MicroBatchCut(lengths, 2, None, 1)
    candidates = candidate_layouts(range(8), cut, 2)
    assert candidates[-1].rows == ((0, 1), (2, 3), (4, 5), (6, 7))
    # the sorted cut pairs neighbours in length: 7 with 6, not 7 with 1
    assert candidates[0].rows[0] == (0, 2)
