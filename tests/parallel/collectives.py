"""Count the torch.distributed collectives a piece of code issues (the real ones still run)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch.distributed as dist

_WATCHED = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "gather", "scatter")


_OP_NAMES = {dist.ReduceOp.MAX: "MAX", dist.ReduceOp.SUM: "SUM"}


@contextlib.contextmanager
def count_collectives() -> Iterator[Counter]:
    """Yield a Counter of ``name`` (``all_reduce:<op>`` for all-reduces) filled while inside."""
    counts: Counter = Counter()
    originals = {name: getattr(dist, name) for name in _WATCHED}

    def spy(name: str):
        def call(*args, **kwargs):
            if name == "all_reduce":
                op = kwargs.get("op", args[1] if len(args) > 1 else dist.ReduceOp.SUM)
                counts[f"all_reduce:{_OP_NAMES.get(op, op)}"] += 1
            else:
                counts[name] += 1
            return originals[name](*args, **kwargs)

        return call

    for name in _WATCHED:
        setattr(dist, name, spy(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
