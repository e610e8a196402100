"""Count the torch.distributed collectives a piece of code issues and record the shapes of its
all-reduces (the real collectives still run)."""

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


@contextlib.contextmanager
def all_reduce_payloads() -> Iterator[list[tuple[str, tuple[int, ...]]]]:
    """Yield a list of ``(op, shape)`` of every all-reduce issued while inside, in order."""
    payloads: list[tuple[str, tuple[int, ...]]] = []
    original = dist.all_reduce

    def call(tensor, *args, **kwargs):
        op = kwargs.get("op", args[0] if args else dist.ReduceOp.SUM)
        payloads.append((_OP_NAMES.get(op, str(op)), tuple(tensor.shape)))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = call
    try:
        yield payloads
    finally:
        dist.all_reduce = original
