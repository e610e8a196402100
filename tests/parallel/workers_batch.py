"""Rank functions for the global-batch tests: prepare() across TP layouts,
broadcast_from_last_stage (run by tests/parallel/world.py)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from opefo_nemo.core.objectives import (
    Objective,
    TokenChunk,
    build_objective,
    method_config,
    prepare,
)
from opefo_nemo.core.reduction import SingleProcessReducer
from opefo_nemo.parallel import VOCAB_SUMS, broadcast_from_last_stage, token_stats
from tests.parallel.collectives import count_collectives
from tests.parallel.world import GROUP_TIMEOUT

SEQS, SEQ_LEN, VOCAB = 12, 10, 40

METHODS = {
    "opefo": {"name": "opefo", "entropy_flow": {"balance": "adaptive"}},
    "opefo_tabular": {
        "name": "opefo",
        "entropy_flow": {"balance": "adaptive", "estimator": "tabular"},
    },
    "clip_cov": {
        "name": "clip_cov",
        "updates_per_rollout": 8,
        "clip_cov": {"ratio": 0.1, "lb": 0.05},
    },
    "kl_cov": {"name": "kl_cov", "updates_per_rollout": 8, "kl_cov": {"ratio": 0.1}},
    "steer": {"name": "steer", "steer": {"scope": "batch"}},
}


def shared_rollout(seed: int = 0) -> dict[str, torch.Tensor]:
    """One optimizer-step batch ``[SEQS, SEQ_LEN]``, identical on every rank."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, SEQ_LEN + 1, (SEQS,), generator=gen)
    prompt = torch.randint(0, 3, (SEQS,), generator=gen)
    position = torch.arange(SEQ_LEN)
    return {
        "logits": torch.randn(SEQS, SEQ_LEN, VOCAB, generator=gen) * 3,
        "targets": torch.randint(0, VOCAB, (SEQS, SEQ_LEN), generator=gen),
        "advantages": (torch.randn(SEQS, generator=gen) * 1.5)[:, None].expand(SEQS, SEQ_LEN),
        "mask": (position >= prompt[:, None]) & (position < lengths[:, None]),
        "old_noise": torch.randn(SEQS, SEQ_LEN, generator=gen) * 0.3,
        "token_ids": torch.arange(SEQS * SEQ_LEN).view(SEQS, SEQ_LEN) * 7 + 1000,
    }


def _chunk(batch, rows, stats, old_logprob) -> TokenChunk:
    return TokenChunk(
        logprob=stats.logprob,
        entropy=stats.entropy,
        advantages=batch["advantages"][rows].contiguous(),
        mask=batch["mask"][rows],
        old_logprob=None if old_logprob is None else old_logprob[rows],
        token_ids=batch["token_ids"][rows],
        sum_p2=stats.sum_p2,
        sum_p2_logp=stats.sum_p2_logp,
    )


def _config(name: str) -> Objective:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_objective(method_config(METHODS[name]))


def _tensor_parallel_group(tp: int, rank: int):
    """TP groups of consecutive ranks (megatron's order); ``None`` outside the first ``tp``
    ranks' groups is fine: every rank builds every group."""
    mine = None
    for start in range(0, 4, tp):
        ranks = list(range(start, start + tp))
        group = dist.new_group(ranks, timeout=GROUP_TIMEOUT)
        mine = group if rank in ranks else mine
    return mine


def _tp_dp_groups(tp: int, rank: int, world_size: int):
    """This rank's TP group (:func:`_tensor_parallel_group`) and data-parallel group (ranks
    ``first, first + tp, ...``: at TP 2 on 4 ranks {0, 2} and {1, 3})."""
    tp_group = _tensor_parallel_group(tp, rank)
    dp_group = None
    for first in range(tp):
        ranks = list(range(first, world_size, tp))
        group = dist.new_group(ranks, timeout=GROUP_TIMEOUT)
        dp_group = group if rank in ranks else dp_group
    return tp_group, dp_group


def prepare_is_layout_independent(rank: int, world_size: int) -> None:
    """λ*, the global sums, the token count, the weights and the Clip-Cov / KL-Cov selections of
    prepare() from vocab-parallel statistics equal the single-process ones for TP ∈ {1,2,4} and
    1 or 3 micro-batches (every rank holds the whole batch's statistics, as the engines give
    them to the trainer).
    """
    batch = shared_rollout()
    full = token_stats(batch["logits"], batch["targets"], sums=VOCAB_SUMS)
    old_logprob = full.logprob + batch["old_noise"]
    references = {}
    for name in METHODS:
        olds = old_logprob if _config(name).config.updates_per_rollout > 1 else None
        chunk = _chunk(batch, slice(None), full, olds)
        references[name] = prepare(_config(name), [chunk], SingleProcessReducer(), seed=5)
    for name in ("clip_cov", "kl_cov"):
        picked = int(references[name].coefficients[0].selected.sum())
        assert picked >= 3, f"{name} selects {picked} tokens: the check would be vacuous"
    for tp in (1, 2, 4):
        tp_group = _tensor_parallel_group(tp, rank)
        tp_rank = rank % tp
        padded = -(-VOCAB // (4 * tp)) * 4 * tp
        logits = torch.cat([batch["logits"], torch.zeros(SEQS, SEQ_LEN, padded - VOCAB)], -1)
        width = padded // tp
        shard = logits[..., tp_rank * width : (tp_rank + 1) * width]
        for micro in (1, 3):
            row_sets = torch.arange(SEQS).chunk(micro)
            stats = [
                token_stats(
                    shard[rows],
                    batch["targets"][rows],
                    group=tp_group if tp > 1 else None,
                    vocab_size=VOCAB,
                    sums=VOCAB_SUMS,
                )
                for rows in row_sets
            ]
            for name, ref in references.items():
                config = _config(name)
                olds = old_logprob if config.config.updates_per_rollout > 1 else None
                chunks = [
                    _chunk(batch, rows, s, olds) for rows, s in zip(row_sets, stats, strict=True)
                ]
                with count_collectives() as calls:
                    got = prepare(config, chunks, SingleProcessReducer(), seed=5)
                where = f"TP={tp} micro={micro} {name}"
                assert not calls, (where, dict(calls))  # prepare itself communicates nothing
                assert got.n_tokens == ref.n_tokens, where
                # λ* has scale 1; each sum the magnitude of its terms (tests/metric_bounds.py):
                # its own for the sums of one sign, Σ|A| for the advantages' (Clip-Cov, KL-Cov)
                assert abs(got.lambda_star - ref.lambda_star) <= 1e-6, where
                terms = {"cov_advantages": float((batch["advantages"].abs() * batch["mask"]).sum())}
                for key, value in ref.sums.items():
                    bound = 1e-6 * terms.get(key, abs(float(value)))
                    assert abs(float(got.sums[key]) - float(value)) <= bound, f"{where} sum {key}"
                for rows, coef in zip(row_sets, got.coefficients, strict=True):
                    ref_coef = ref.coefficients[0]
                    assert torch.equal(coef.selected, ref_coef.selected[rows]), (
                        f"{where}: selection differs"
                    )
                    torch.testing.assert_close(
                        coef.weight, ref_coef.weight[rows], rtol=1e-6, atol=1e-6, msg=where
                    )
    dist.barrier()


def broadcast_reaches_every_stage(rank: int, world_size: int) -> None:
    """Stages 0..2 get the last stage's per-token tensors of three dtypes, one broadcast each."""
    gen = torch.Generator().manual_seed(4)
    values = {
        "logprob": -torch.rand(3, 5, generator=gen),
        "entropy": torch.rand(3, 5, generator=gen),
        "token_ids": torch.randint(0, 1000, (3, 5), generator=gen),
        "mask": torch.rand(3, 5, generator=gen) > 0.5,
    }
    last = rank == world_size - 1
    tensors = {n: v.clone() if last else torch.zeros_like(v) for n, v in values.items()}
    with count_collectives() as calls:
        got = broadcast_from_last_stage(tensors, dist.group.WORLD)
    assert dict(calls) == {"broadcast": 3}
    for name, value in values.items():
        assert torch.equal(got[name], value) and got[name] is tensors[name], name
    dist.barrier()


#: Methods whose reweighting metrics the TP 2 × DP 2 test compares (spec §6).
REWEIGHTED = {
    "opefo": {"name": "opefo"},
    "opefo_tabular": {"name": "opefo", "entropy_flow": {"estimator": "tabular"}},
    "static": {"name": "static", "entropy_flow": {"balance": "static", "static_lambda": 0.3}},
    "grpo_strict": {"name": "grpo_strict"},
}


def confident_rollout(seed: int = 5) -> dict[str, torch.Tensor]:
    """A batch ``[SEQS, SEQ_LEN]`` whose sampled tokens are often the argmax of peaked logits, so
    that many have ``π(y) > 0.9`` (confident) and many not."""
    batch = shared_rollout(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    logits = batch["logits"] * 4
    greedy = torch.rand(SEQS, SEQ_LEN, generator=gen) < 0.6
    batch["logits"] = logits
    batch["targets"] = torch.where(greedy, logits.argmax(-1), batch["targets"])
    return batch


def reweighting_metrics_at_tp2_dp2(rank: int, world_size: int) -> None:
    """The reweighting metrics of prepare() (flows by advantage sign, advantage shifts, confident
    shares) on TP 2 × DP 2, each data-parallel rank holding half of the rows in two
    micro-batches and half of the vocabulary per tensor-parallel rank, summed over the
    data-parallel group by a gloo reducer, equal the single-process prepare() of the whole batch
    within fp32 round-off of their terms (tests/metric_bounds.py)."""
    from opefo_nemo.core.reweighting import DEFAULT_CONFIDENT_PROB
    from tests.metric_bounds import assert_metrics_close
    from tests.parallel.reducer import GroupReducer

    batch = confident_rollout()
    full = token_stats(batch["logits"], batch["targets"], sums=VOCAB_SUMS)
    probs = full.logprob.double().exp()[batch["mask"]]
    confident = int((probs > DEFAULT_CONFIDENT_PROB).sum())
    assert 10 <= confident <= len(probs) - 10, f"{confident} of {len(probs)} tokens confident"
    margin = float((probs - DEFAULT_CONFIDENT_PROB).abs().min())
    assert margin > 1e-4, "a token at the threshold could flip between layouts"

    tp, dp = 2, 2
    tp_group, dp_group = _tp_dp_groups(tp, rank, world_size)
    tp_rank, dp_rank = rank % tp, rank // tp
    width = VOCAB // tp
    shard = batch["logits"][..., tp_rank * width : (tp_rank + 1) * width]
    mine = torch.arange(SEQS).chunk(dp)[dp_rank]
    row_sets = mine.chunk(2)
    stats = [
        token_stats(shard[rows], batch["targets"][rows], group=tp_group, sums=VOCAB_SUMS)
        for rows in row_sets
    ]
    for name, spec in REWEIGHTED.items():
        want = prepare(
            build_objective(method_config(spec)),
            [_chunk(batch, slice(None), full, None)],
            SingleProcessReducer(),
        )
        got = prepare(
            build_objective(method_config(spec)),
            [_chunk(batch, rows, s, None) for rows, s in zip(row_sets, stats, strict=True)],
            GroupReducer(dp_group),
        )
        assert got.n_tokens == want.n_tokens, name
        assert want.metrics["flow/pos_adv_neg"] > 0 and want.metrics["flow/neg_adv_pos"] > 0
        if name != "grpo_strict":
            assert abs(want.metrics["flow/adv_shift_confident"]) > 1e-3, name
        assert_metrics_close(got.metrics, want.metrics, rel=1e-5)
    dist.barrier()


def steer_weights_at_tp2_dp2(rank: int, world_size: int) -> None:
    """STEER's batch-scope weights on TP 2 × DP 2 (each data-parallel rank holding half of the
    rows in two micro-batches, the least and largest |Ω| found by a gloo reducer's top-k) equal the
    single-process weights of the whole batch within fp32 round-off, and so do the batch's |Ω|
    range and mean weight."""
    from tests.parallel.reducer import GroupReducer

    batch = shared_rollout(seed=3)
    full = token_stats(batch["logits"], batch["targets"], sums=VOCAB_SUMS)
    old_logprob = full.logprob + batch["old_noise"]
    tp, dp = 2, 2
    tp_group, dp_group = _tp_dp_groups(tp, rank, world_size)
    tp_rank, dp_rank = rank % tp, rank // tp
    width = VOCAB // tp
    shard = batch["logits"][..., tp_rank * width : (tp_rank + 1) * width]
    row_sets = torch.arange(SEQS).chunk(dp)[dp_rank].chunk(2)
    stats = [token_stats(shard[rows], batch["targets"][rows], group=tp_group) for rows in row_sets]
    want = prepare(
        _config("steer"), [_chunk(batch, slice(None), full, old_logprob)], SingleProcessReducer()
    )
    got = prepare(
        _config("steer"),
        [_chunk(batch, rows, st, old_logprob) for rows, st in zip(row_sets, stats, strict=True)],
        GroupReducer(dp_group),
    )
    weights = want.coefficients[0].weight
    assert float(weights[batch["mask"]].min()) < 0.9 < 1.1 < float(weights[batch["mask"]].max())
    for rows, coefficients in zip(row_sets, got.coefficients, strict=True):
        mask = batch["mask"][rows]
        # w = w_max − (|Ω| − m)(w_max − w_min)/(M − m): an error δ in |Ω|, m or M moves w by at
        # most (w_max − w_min) δ/(M − m); δ ≤ 64 fp32 roundings of M (Ω's factors summed over
        # the vocabulary in another order, then multiplied), for each of the three
        span = want.metrics["steer/omega_max"] - want.metrics["steer/omega_min"]
        delta = 64 * torch.finfo(torch.float32).eps * want.metrics["steer/omega_max"]
        bound = (1.2 - 0.8) * 3 * delta / span
        torch.testing.assert_close(
            coefficients.weight[mask], weights[rows][mask], rtol=0, atol=bound
        )
    for key in ("steer/omega_min", "steer/omega_max", "steer/weight_mean"):
        assert abs(got.metrics[key] - want.metrics[key]) <= 1e-5 * abs(want.metrics[key]), key
    dist.barrier()
