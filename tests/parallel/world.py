"""Run a function on every rank of a real multi-process gloo world (torch.multiprocessing spawn).

Every process group gets a timeout, so a rank that fails makes its peers fail at their next
collective instead of hanging; ``spawn`` re-raises the first failure in the test process.
Worker functions live in importable modules (``tests.parallel.workers_*``) so spawn can find them.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Timeout of every process group in these tests: long enough for two busy CPU cores.
GROUP_TIMEOUT = datetime.timedelta(seconds=60)
#: Backstop: the test fails (and kills the world) if it has not finished by then.
WORLD_DEADLINE_S = 240.0


def run_world(
    fn: Callable[..., None],
    world_size: int,
    *args: object,
    group_timeout: datetime.timedelta = GROUP_TIMEOUT,
    deadline_s: float = WORLD_DEADLINE_S,
) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks (longer
    ``group_timeout`` / ``deadline_s`` for workers that start servers between collectives)."""
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        context = mp.spawn(
            _entry,
            args=(fn, world_size, init, group_timeout, args),
            nprocs=world_size,
            join=False,
        )
        deadline = time.monotonic() + deadline_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"{fn.__name__} ran past {deadline_s} s: a rank hung")


def _entry(
    rank: int,
    fn: Callable[..., None],
    world_size: int,
    init: str,
    group_timeout: datetime.timedelta,
    args: tuple[object, ...],
) -> None:
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world_size, timeout=group_timeout
    )
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def subgroups(size: int, world_size: int) -> dist.ProcessGroup | None:
    """Split the world into consecutive groups of ``size`` ranks; this rank's group.

    Collective: every rank creates every group (torch.distributed's rule). ``None`` for ranks
    beyond the last full group.
    """
    mine = None
    for start in range(0, world_size - size + 1, size):
        ranks = list(range(start, start + size))
        group = dist.new_group(ranks, timeout=GROUP_TIMEOUT)
        if dist.get_rank() in ranks:
            mine = group
    return mine
