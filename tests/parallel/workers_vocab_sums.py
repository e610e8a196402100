"""Rank functions for the vocabulary sums Σπ², Σπ² log π, Σπ³, Σπ³ log π and the ``expectation``
ΔH estimator over gloo TP groups (run by tests/parallel/world.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from opefo_nemo.core.entropy_flow import ESTIMATOR_SUMS, delta_entropy
from opefo_nemo.parallel import VOCAB_SUMS, token_stats
from tests.kernels.tolerances import U32, row_eps, stats_tol
from tests.parallel.collectives import all_reduce_payloads, count_collectives
from tests.parallel.reference import brute_force_rows
from tests.parallel.world import subgroups

VOCAB = 37  # odd; padded to a multiple of 4 × TP as Megatron does: 40 at TP 1 and 2, 48 at TP 4
TOKENS, CHUNK = 13, 5  # three chunks: 5, 5, 3 tokens
TEMPERATURE = 0.8


def padded_vocab(tp: int) -> int:
    return -(-VOCAB // (4 * tp)) * 4 * tp


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same logits ``[TOKENS, VOCAB]`` (a peaked row, a flat row, the rest random),
    targets and advantages on every rank."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(TOKENS, VOCAB, generator=gen) * 3
    logits[0, 5] = 25.0  # nearly one-hot
    logits[1] = 0.01 * logits[1]  # nearly uniform
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    advantages = torch.randn(TOKENS, generator=gen)
    return logits, targets, advantages


def _shard(logits: torch.Tensor, tp: int, tp_rank: int) -> torch.Tensor:
    """This rank's columns, the padding holding large logits (they must not count)."""
    pad = torch.full((logits.shape[0], padded_vocab(tp) - VOCAB), 40.0)
    padded = torch.cat([logits, pad], dim=1)
    width = padded.shape[1] // tp
    return padded[:, tp_rank * width : (tp_rank + 1) * width].contiguous()


def expectation_tol(ref: dict[str, torch.Tensor], adv: torch.Tensor, eps: torch.Tensor):
    """Bound on the fp32 ``expectation`` ΔH = −A[(s3l + H s3) − 2(s2l + H s2)]: each input
    statistic ``x`` is within ``eps (1 + |x|)`` (tolerances.stats_tol), propagated through the
    products and sums, plus four roundings of the result's terms."""
    h, s2, s2l, s3, s3l = (
        ref[k] for k in ("entropy", "sum_p2", "sum_p2_logp", "sum_p3", "sum_p3_logp")
    )
    spread = (
        (1 + s3l.abs())
        + h * (1 + s3)
        + s3 * (1 + h)
        + 2 * ((1 + s2l.abs()) + h * (1 + s2) + s2 * (1 + h))
    )
    terms = s3l.abs() + h * s3 + 2 * (s2l.abs() + h * s2)
    return adv.double().abs() * (eps * spread + 4 * U32 * terms)


def sums_match_brute_force(rank: int, world_size: int) -> None:
    """TP 1, 2, 4, T = 0.8, odd V with padded columns, three chunks: the four vocabulary sums and
    the ``expectation`` ΔH from them equal the token-by-token float64 softmax; ΔH·A ≥ 0."""
    logits, targets, adv = _batch()
    brute = brute_force_rows(logits, TEMPERATURE)
    eps = row_eps(logits.double(), TEMPERATURE)
    for tp in (1, 2, 4):
        group = subgroups(tp, world_size) if tp > 1 else None
        stats = token_stats(
            _shard(logits, tp, rank % tp),
            targets,
            temperature=TEMPERATURE,
            group=group,
            vocab_size=VOCAB,
            sums=VOCAB_SUMS,
            chunk_size=CHUNK,
        )
        for name in ("entropy", *VOCAB_SUMS):
            err = (getattr(stats, name).double() - brute[name]).abs()
            bound = stats_tol(eps, brute[name])
            assert bool((err <= bound).all()), f"TP={tp} {name}: error {err.max():.3g}"
        delta_h = delta_entropy(
            stats.logprob,
            stats.entropy,
            adv,
            "expectation",
            **{n: getattr(stats, n) for n in VOCAB_SUMS},
        )
        want = -adv.double() * brute["expectation"]
        err = (delta_h.double() - want).abs()
        assert bool((err <= expectation_tol(brute, adv, eps)).all()), f"TP={tp}: {err.max():.3g}"
        assert bool((delta_h.double() * adv.double() >= -expectation_tol(brute, adv, eps)).all())
        if group is not None:
            dist.barrier(group)
    dist.barrier()


def payload_follows_the_request(rank: int, world_size: int) -> None:
    """TP 2: per chunk one MAX and one SUM whatever is asked; the SUM packs ``[c, 3]`` without
    a request (as before the vocabulary sums existed), two more columns per power of π asked
    for, and the result holds exactly the sums asked for, equal to the all-sums request's."""
    logits, targets, _ = _batch(seed=1)
    group = subgroups(2, world_size)
    local = _shard(logits, 2, rank % 2)
    kw = {"temperature": TEMPERATURE, "group": group, "vocab_size": VOCAB, "chunk_size": CHUNK}
    everything = token_stats(local, targets, sums=VOCAB_SUMS, **kw)
    requests = {
        (): 3,
        ("sum_p2",): 5,
        ESTIMATOR_SUMS["tabular"]: 5,
        ("sum_p3_logp",): 5,
        ("sum_p3", "sum_p2"): 7,
        ESTIMATOR_SUMS["expectation"]: 7,
    }
    for request, columns in requests.items():
        with count_collectives() as calls, all_reduce_payloads() as payloads:
            stats = token_stats(local, targets, sums=request, **kw)
        assert dict(calls) == {"all_reduce:MAX": 3, "all_reduce:SUM": 3}, dict(calls)
        sums = [shape for op, shape in payloads if op == "SUM"]
        assert sums == [(5, columns), (5, columns), (3, columns)], (request, sums)
        assert set(stats.present()) == {"logprob", "entropy", *request}, request
        for name, value in stats.present().items():
            assert torch.equal(value, getattr(everything, name)), (request, name)
    dist.barrier()
