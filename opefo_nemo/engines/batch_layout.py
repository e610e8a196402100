"""Which rows of a rollout batch share a micro-batch and which data-parallel rank runs it
(``engine.batch_layout``, ``engine.max_tokens_per_micro_batch``), and what a layout costs in
padding and in waiting for the slowest rank (spec §11; docs/batch_layout.md). Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from opefo_nemo.config.engines import BALANCED, BATCH_LAYOUTS
from opefo_nemo.engines.rank_balance import improve, karmarkar_karp


@dataclass(frozen=True)
class MicroBatchLayout:
    """Micro-batches of one pass over (part of) a batch and the data-parallel rank that runs
    each."""

    rows: tuple[tuple[int, ...], ...]
    """``rows[i]``: the row indices (into the batch the pass is given, ascending) of
    micro-batch ``i``."""
    owners: tuple[int, ...]
    """``owners[i]``: the data-parallel rank that runs micro-batch ``i``; non-decreasing: rank
    0's micro-batches first, each rank's in the order it runs them."""
    data_parallel: int
    """``D``: every rank in ``0 … D − 1`` may own any number of micro-batches (0 included)."""

    def __post_init__(self) -> None:
        if self.data_parallel < 1:
            raise ValueError(f"data_parallel must be >= 1, got {self.data_parallel}")
        if len(self.owners) != len(self.rows):
            raise ValueError(f"{len(self.owners)} owners for {len(self.rows)} micro-batches")
        if any(not 0 <= o < self.data_parallel for o in self.owners):
            raise ValueError(f"owners {self.owners} outside ranks 0 … {self.data_parallel - 1}")
        if list(self.owners) != sorted(self.owners):
            raise ValueError(f"owners {self.owners} are not non-decreasing")
        if any(not micro for micro in self.rows):
            raise ValueError("a micro-batch without rows")
        flat = self.flat_rows
        if len(set(flat)) != len(flat):
            raise ValueError("a row appears in two micro-batches")

    @property
    def flat_rows(self) -> tuple[int, ...]:
        """Every row of the layout, micro-batch after micro-batch."""
        return tuple(row for micro in self.rows for row in micro)

    def of_rank(self, rank: int) -> list[int]:
        """The indices ``i`` of the micro-batches ``rank`` owns, in the order it runs them."""
        return [i for i, owner in enumerate(self.owners) if owner == rank]

    def shifted(self, offset: int) -> MicroBatchLayout:
        """The same layout with every row index moved by ``offset`` (the rows of a mini-batch
        counted from its own first row: ``offset = −first``)."""
        rows = tuple(tuple(row + offset for row in micro) for micro in self.rows)
        return MicroBatchLayout(rows, self.owners, self.data_parallel)

    def covers(self, rows: int) -> bool:
        """Whether the layout holds every row ``0 … rows − 1`` exactly once."""
        return sorted(self.flat_rows) == list(range(rows))


def concatenated(layouts: Sequence[MicroBatchLayout]) -> MicroBatchLayout:
    """One pass over the rows of all ``layouts`` (one data-parallel size): each rank runs its
    micro-batches of the first layout, then of the second, and so on."""
    if not layouts or len({layout.data_parallel for layout in layouts}) != 1:
        raise ValueError("concatenated needs layouts of one data-parallel size")
    size = layouts[0].data_parallel
    order = [
        (rank, layout.rows[i])
        for rank in range(size)
        for layout in layouts
        for i in layout.of_rank(rank)
    ]
    return MicroBatchLayout(
        tuple(rows for _, rows in order), tuple(rank for rank, _ in order), size
    )


def padded_width(lengths: Sequence[int], rows: Sequence[int], multiple: int = 1) -> int:
    """The width a micro-batch of ``rows`` runs at: its longest row, rounded up to ``multiple``
    (the sequence-parallel multiple)."""
    return -(-max(lengths[row] for row in rows) // multiple) * multiple


def sequence_work(width: int, attention_width: int | None = None) -> int:
    """The work of one sequence of ``width`` positions (spec §11): ``width`` (its positions, the
    linear layers' work), or with ``attention_width`` ``A`` (the width at which a position's
    causal attention costs what its linear layers do:
    :meth:`~opefo_nemo.models.shape.ModelShape.attention_width`) ``width·(A + width)``:
    the linear layers' ``A·width`` plus attention's ``width²``, in units of ``1 / A`` position."""
    return width if attention_width is None else width * (attention_width + width)


def micro_batch_work(
    lengths: Sequence[int],
    rows: Sequence[int],
    multiple: int = 1,
    attention_width: int | None = None,
) -> int:
    """The work of a micro-batch of ``rows``: rows × the work of a sequence at its padded
    width (:func:`padded_width`, :func:`sequence_work`)."""
    return len(rows) * sequence_work(padded_width(lengths, rows, multiple), attention_width)


def rank_work(
    layout: MicroBatchLayout,
    lengths: Sequence[int],
    multiple: int = 1,
    attention_width: int | None = None,
) -> list[int]:
    """Each rank's work in ``layout``: Σ over its micro-batches of :func:`micro_batch_work`
    (without ``attention_width``: rows × padded width, the positions its passes compute;
    spec §11)."""
    work = [0] * layout.data_parallel
    for rows, owner in zip(layout.rows, layout.owners, strict=True):
        work[owner] += micro_batch_work(lengths, rows, multiple, attention_width)
    return work


def pad_fraction(
    passes: Sequence[MicroBatchLayout],
    lengths: Sequence[int],
    multiple: int = 1,
    attention_width: int | None = None,
) -> float:
    """``perf/pad_fraction`` (spec §11): the share of the work of the micro-batches of every
    pass, on every rank, spent on padding: 1 − Σ of each row's work at its own length
    (``lengths[row]`` tokens) over Σ of :func:`rank_work`. Without ``attention_width``: padded
    positions over all positions."""
    total = sum(sum(rank_work(layout, lengths, multiple, attention_width)) for layout in passes)
    real = sum(
        sequence_work(lengths[row], attention_width)
        for layout in passes
        for row in layout.flat_rows
    )
    return (total - real) / total if total else 0.0


def dp_imbalance(
    passes: Sequence[MicroBatchLayout],
    lengths: Sequence[int],
    multiple: int = 1,
    attention_width: int | None = None,
) -> float:
    """``perf/dp_imbalance`` (spec §11): each pass waits for its slowest rank, so Σ over the
    passes of the largest rank's work (:func:`rank_work`) over Σ of the mean rank's work (1 on
    one rank, and when every rank of every pass has the same work)."""
    slowest = mean = Fraction(0)
    for layout in passes:
        work = rank_work(layout, lengths, multiple, attention_width)
        slowest += max(work)
        mean += Fraction(sum(work), len(work))
    return float(slowest / mean) if mean else 1.0


def plan_layouts(
    lengths: Sequence[int],
    *,
    mini_batches: int = 1,
    data_parallel: int = 1,
    micro_batch_size: int = 1,
    max_tokens: int | None = None,
    multiple: int = 1,
    layout: str = BALANCED,
    attention_width: int | None = None,
) -> list[MicroBatchLayout]:
    """One :class:`MicroBatchLayout` per mini-batch of the rows whose tokens are ``lengths``
    (prompt and response; row indices into the whole batch): mini-batch ``j`` holds the rows
    ``[j·B/k, (j+1)·B/k)`` of ``k = mini_batches``, and no micro-batch crosses two.

    Micro-batches hold ``micro_batch_size`` rows, or with ``max_tokens`` as many rows as keep
    rows × padded width (:func:`padded_width`, ``multiple``) within it; a row longer than
    ``max_tokens`` runs alone. ``contiguous``: consecutive rows, micro-batch ``i`` of ``M`` run
    by rank ``⌊i·D/M⌋`` (with ``micro_batch_size``, ``TrainBatch.split``'s micro-batches).
    ``balanced``: :func:`balanced_layout`, ranks balanced by their work (:func:`rank_work` with
    ``attention_width``: attention's share counted, ``None``: positions only)."""
    rows = len(lengths)
    if mini_batches < 1 or rows % mini_batches:
        raise ValueError(f"{rows} rows do not split into {mini_batches} equal mini-batches")
    for name, value in (("micro_batch_size", micro_batch_size), ("multiple", multiple)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
    if layout not in BATCH_LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {', '.join(BATCH_LAYOUTS)}")
    if attention_width is not None and attention_width < 1:
        raise ValueError(f"attention_width must be >= 1 or None, got {attention_width}")
    if any(length < 1 for length in lengths):
        raise ValueError("every row needs at least one token")
    cut = MicroBatchCut(lengths, micro_batch_size, max_tokens, multiple, attention_width)
    size = rows // mini_batches
    plan = balanced_layout if layout == BALANCED else contiguous_layout
    return [plan(range(j * size, (j + 1) * size), cut, data_parallel) for j in range(mini_batches)]


@dataclass(frozen=True)
class MicroBatchCut:
    """How rows in a given order are cut into consecutive micro-batches: ``size`` rows each, or
    (with ``max_tokens``) as many as keep rows × padded width within it; and what a
    micro-batch's work is (:func:`micro_batch_work`)."""

    lengths: Sequence[int]
    size: int
    max_tokens: int | None
    multiple: int
    attention_width: int | None = None
    """``A`` of :func:`sequence_work` (``None``: a micro-batch's work is its positions)."""

    def __call__(self, order: Sequence[int]) -> list[tuple[int, ...]]:
        if self.max_tokens is None:
            pieces = [order[s : s + self.size] for s in range(0, len(order), self.size)]
            return [tuple(sorted(piece)) for piece in pieces]
        return self.fill(order, self.max_tokens)

    def fill(self, order: Sequence[int], cap: int) -> list[tuple[int, ...]]:
        """Each micro-batch takes rows while rows × padded width stays within ``cap``; a row
        wider than ``cap`` runs alone. In an order sorted by length this is the fewest
        micro-batches any cut of that order within ``cap`` makes."""
        pieces: list[tuple[int, ...]] = []
        current: list[int] = []
        width = 0
        for row in order:
            own = padded_width(self.lengths, [row], self.multiple)
            if current and (len(current) + 1) * max(width, own) > cap:
                pieces.append(tuple(sorted(current)))
                current, width = [], 0
            current.append(row)
            width = max(width, own)
        return [*pieces, tuple(sorted(current))] if current else pieces

    def even(self, order: Sequence[int], parts: int) -> list[tuple[int, ...]]:
        """:meth:`fill` with the least cap (at most ``max_tokens``) that makes at most ``parts``
        micro-batches: the cut of ``order`` whose heaviest micro-batch is lightest (a bisection
        over the cap; the count only falls as the cap grows)."""
        assert self.max_tokens is not None
        low, high = 1, self.max_tokens
        while low < high:
            middle = (low + high) // 2
            if len(self.fill(order, middle)) <= parts:
                high = middle
            else:
                low = middle + 1
        return self.fill(order, high)

    def work(self, rows: Sequence[int]) -> int:
        """:func:`micro_batch_work` of ``rows``."""
        return micro_batch_work(self.lengths, rows, self.multiple, self.attention_width)


def contiguous_layout(
    rows: Sequence[int], cut: MicroBatchCut, data_parallel: int
) -> MicroBatchLayout:
    """Consecutive rows cut into micro-batches, micro-batch ``i`` of ``M`` run by rank
    ``⌊i·D/M⌋`` (equal contiguous blocks when ``D`` divides ``M``)."""
    micros = cut(list(rows))
    owners = tuple(i * data_parallel // len(micros) for i in range(len(micros)))
    return MicroBatchLayout(tuple(micros), owners, data_parallel)


def balanced_layout(
    rows: Sequence[int], cut: MicroBatchCut, data_parallel: int
) -> MicroBatchLayout:
    """The rows of one mini-batch sorted by length and dealt to ``D`` ranks so that the slowest
    rank's work (:func:`rank_work`) is least: the lightest of :func:`candidate_layouts` (ties:
    the lower :func:`dp_imbalance`, then the candidates' order). The contiguous layout is a
    candidate, so its slowest rank never holds less. With ``micro_batch_size`` every rank runs
    as many micro-batches as in the contiguous layout (the counts differ by at most one, only
    where ``D`` does not divide them); with ``max_tokens`` the counts follow the work."""

    def cost(layout: MicroBatchLayout) -> tuple[int, Fraction]:
        work = rank_work(layout, cut.lengths, cut.multiple, cut.attention_width)
        return max(work), Fraction(max(work) * len(work), sum(work))

    return min(candidate_layouts(rows, cut, data_parallel), key=cost)  # the first of ties


def candidate_layouts(
    rows: Sequence[int], cut: MicroBatchCut, data_parallel: int
) -> list[MicroBatchLayout]:
    """The layouts :func:`balanced_layout` chooses from, the contiguous one last:

    1. the rows sorted by length (longest first, ties by index) and cut into micro-batches
       (with ``max_tokens``: into as many as the fewest fill makes, rounded up to a multiple of
       ``D``, the heaviest as light as it can be, :meth:`MicroBatchCut.even`), dealt to the ranks by
       :func:`~.rank_balance.karmarkar_karp` on their work and improved by
       :func:`~.rank_balance.improve`;
    2. the rows dealt to the ranks first (Karmarkar–Karp on each row's work alone), each rank's
       sorted and cut (with ``micro_batch_size`` only where ``D × micro_batch_size`` divides the
       rows, so that the count of micro-batches stays the contiguous one's);
    3. :func:`contiguous_layout`."""
    order = sorted(rows, key=lambda row: (-cut.lengths[row], row))
    fixed = cut.max_tokens is None
    micros = cut(order)
    if not fixed:
        micros = cut.even(order, -(-len(micros) // data_parallel) * data_parallel)
    weights = [cut.work(micro) for micro in micros]
    groups = karmarkar_karp(weights, data_parallel, equal_counts=fixed)
    groups = improve(groups, weights, moves=not fixed)
    candidates = [_dealt(micros, groups, cut, data_parallel)]
    if not fixed or len(rows) % (data_parallel * cut.size) == 0:
        padded = [cut.work([row]) for row in order]
        shares = karmarkar_karp(padded, data_parallel, equal_counts=fixed)
        per_rank = [cut([order[i] for i in share]) for share in shares]
        flat = [micro for share in per_rank for micro in share]
        owned, start = [], 0
        for share in per_rank:
            owned.append(list(range(start, start + len(share))))
            start += len(share)
        candidates.append(_dealt(flat, owned, cut, data_parallel))
    return [*candidates, contiguous_layout(rows, cut, data_parallel)]


def _dealt(
    micros: Sequence[tuple[int, ...]],
    groups: Sequence[Sequence[int]],
    cut: MicroBatchCut,
    size: int,
) -> MicroBatchLayout:
    """``micros`` owned by the ranks of ``groups`` (indices into ``micros``): the heaviest group
    to rank 0, each rank's micro-batches widest first (ties: first row)."""
    ranked = sorted(groups, key=lambda g: (-sum(cut.work(micros[i]) for i in g), sorted(g)))
    rows, owners = [], []
    for rank, group in enumerate(ranked):
        widest_first = sorted(
            group, key=lambda i: (-padded_width(cut.lengths, micros[i], cut.multiple), micros[i])
        )
        for i in widest_first:
            rows.append(micros[i])
            owners.append(rank)
    return MicroBatchLayout(tuple(rows), tuple(owners), size)
