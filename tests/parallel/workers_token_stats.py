"""Rank functions for the vocab-parallel token_stats tests (run by tests/parallel/world.py)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from opefo_nemo.parallel import VOCAB_SUMS, NonFiniteLogitsError, ShardWidthError, token_stats
from tests.kernels.tolerances import logits_grad_bound
from tests.parallel.collectives import count_collectives
from tests.parallel.reference import (
    assert_stats_within_bounds,
    reference_grads,
    reference_stats,
)
from tests.parallel.world import subgroups

VOCAB = 50  # the true vocabulary; padded to a multiple of 4 × TP as Megatron does
TOKENS = 20
FIELDS = ("logprob", "entropy", *VOCAB_SUMS)


def padded_vocab(tp: int, divisible_by: int = 4) -> int:
    multiple = divisible_by * tp
    return -(-VOCAB // multiple) * multiple


def shared_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The same ``[TOKENS, VOCAB]`` logits and targets on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(TOKENS, VOCAB, generator=gen) * 3, torch.randint(
        0, VOCAB, (TOKENS,), generator=gen
    )


def shard_of(full: torch.Tensor, tp: int, tp_rank: int) -> torch.Tensor:
    """This rank's columns of ``full`` padded with large logits (they must not count)."""
    pad = padded_vocab(tp) - VOCAB
    padded = torch.cat([full, torch.full((full.shape[0], pad), 40.0)], dim=1)
    width = padded.shape[1] // tp
    return padded[:, tp_rank * width : (tp_rank + 1) * width].contiguous()


def stats_match_reference(rank: int, world_size: int) -> None:
    """TP 1, 2, 4 (padded vocabulary), fp32 and bf16, 2-d and 3-d input, chunked: statistics and
    gradients equal a float64 full-vocabulary reference; exactly one all-reduce MAX and one SUM per
    chunk in forward, none in backward, no gather."""
    logits, targets = shared_batch()
    gen = torch.Generator().manual_seed(7)
    g_l, g_h = torch.randn(TOKENS, generator=gen), torch.randn(TOKENS, generator=gen)
    temperature, chunk = 0.8, 7  # 20 tokens: 3 chunks
    for tp in (1, 2, 4):
        group = subgroups(tp, world_size) if tp > 1 else None
        tp_rank = rank % tp
        width = padded_vocab(tp) // tp
        for dtype in (torch.float32, torch.bfloat16):
            rounded = logits.to(dtype)
            local = shard_of(rounded.float(), tp, tp_rank).to(dtype).requires_grad_()
            for shape in ((TOKENS,), (4, 5)):
                with count_collectives() as forward_calls:
                    stats = token_stats(
                        local.view(*shape, width),
                        targets.view(shape),
                        temperature=temperature,
                        group=group,
                        vocab_size=VOCAB,
                        sums=VOCAB_SUMS,
                        chunk_size=chunk,
                    )
                expected = {"all_reduce:MAX": 3, "all_reduce:SUM": 3} if tp > 1 else {}
                assert dict(forward_calls) == expected, (tp, dict(forward_calls))
                ref = reference_stats(rounded.double(), targets, temperature)
                where = f"TP={tp} {dtype}"
                assert_stats_within_bounds(stats, ref, rounded.double(), temperature, where)
                loss = (stats.logprob.reshape(-1) * g_l).sum() + (
                    stats.entropy.reshape(-1) * g_h
                ).sum()
                with count_collectives() as backward_calls:
                    (grad,) = torch.autograd.grad(loss, local)
                assert not backward_calls, dict(backward_calls)
                full_grad = reference_grads(rounded, targets, temperature, g_l, g_h)
                bound = logits_grad_bound(
                    rounded.double(), targets, temperature, g_l, g_h, dtype, full_grad
                )
                start = tp_rank * width
                valid = max(0, min(width, VOCAB - start))
                error = (grad[:, :valid].double() - full_grad[:, start : start + valid]).abs()
                assert bool((error <= bound[:, start : start + valid]).all()), where
                assert (grad[:, valid:] == 0).all(), "padded columns got a gradient"
        if group is not None:
            dist.barrier(group)
    dist.barrier()


def _expect(error: type[BaseException], pattern: str, fn) -> None:
    try:
        fn()
    except error as exc:
        assert pattern in str(exc), f"{pattern!r} not in {exc}"
        return
    raise AssertionError(f"expected {error.__name__} containing {pattern!r}")


def errors_fail_every_rank(rank: int, world_size: int) -> None:
    """NaN/+inf logits on one TP rank, shards of different widths, and a bad target make every
    rank of the TP group raise (with the rank and the count), and nobody hangs."""
    logits, targets = shared_batch(seed=1)
    group = subgroups(2, world_size)
    tp_rank = rank % 2
    for bad in (float("nan"), float("inf")):
        local = shard_of(logits, 2, tp_rank)
        if tp_rank == 1:
            local[2, 3] = bad
            local[9, 0] = bad
        here = 2 if tp_rank == 1 else 0
        _expect(
            NonFiniteLogitsError,
            f"TP rank {tp_rank} (global rank {rank}): 2 tokens have non-finite statistics "
            f"from NaN or +inf logits (or no finite logit); {here} of them",
            lambda local=local: token_stats(
                local, targets, group=group, vocab_size=VOCAB, chunk_size=4
            ),
        )
    uneven = logits[:, :26] if tp_rank == 0 else logits[:, 26:]  # 26 + 24 columns
    _expect(
        ShardWidthError,
        "differ in width (24 to 26 columns)",
        lambda: token_stats(uneven, targets, group=group),
    )
    out_of_range = targets.clone()
    out_of_range[4] = VOCAB + 3
    _expect(
        ValueError,
        f"target id {VOCAB + 3} at flat position 4",
        lambda: token_stats(
            shard_of(logits, 2, tp_rank), out_of_range, group=group, vocab_size=VOCAB
        ),
    )
    dist.barrier()


def failing_rank_does_not_hang(rank: int, world_size: int) -> None:
    """Rank 1 of each TP pair rejects its input before communicating; rank 0, already inside the
    all-reduce, fails on the group's timeout instead of hanging."""
    logits, targets = shared_batch(seed=2)
    # The short timeout also bounds the group's connection: every rank enters it together
    # (a rank still starting up on a loaded machine would miss it), with margin for the load.
    short = datetime.timedelta(seconds=5)
    dist.barrier()
    group = None
    for start in range(0, world_size, 2):
        made = dist.new_group([start, start + 1], timeout=short)
        if rank in (start, start + 1):
            group = made
    tp_rank = rank % 2
    mine = targets.clone()
    if tp_rank == 1:
        mine[0] = -5
    try:
        token_stats(shard_of(logits, 2, tp_rank), mine, group=group, vocab_size=VOCAB)
    except ValueError as exc:
        assert tp_rank == 1 and "target id -5" in str(exc), exc
    except RuntimeError as exc:  # gloo's timeout (DistBackendError is a RuntimeError)
        assert tp_rank == 0, exc
    else:
        raise AssertionError(f"rank {rank} returned although its peer failed")
