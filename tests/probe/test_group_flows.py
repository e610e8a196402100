"""``opefo-probe``'s flows per group and per success rate (no model): each group's P and N equal
plain-Python sums of ``prepare``'s per-token ΔH over its rows, they add up to the batch's P and
N, each success rate's λ* is that of its groups' sums, and the report shows them."""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core import SingleProcessReducer, group_advantages
from opefo_nemo.core.entropy_flow import ESTIMATORS
from opefo_nemo.core.objectives import TokenChunk, build_objective, method_config, prepare
from opefo_nemo.probe.group_flows import GroupFlow, by_success_rate, group_flows
from opefo_nemo.probe.output import document, success_rate_table, table
from opefo_nemo.probe.step import ProbeResult

#: Unit round-off of float64, in which ΔH (fp32 values) is summed.
U64 = 2.0**-53
K = 4
#: Correct responses of each group: all, none, and mixed ones (two groups share a rate).
HITS = (4, 0, 1, 3, 2, 1)
#: Rows per micro-batch: consecutive row blocks of the batch, uneven like a last micro-batch.
MICRO_ROWS = (7, 7, 7, 3)


def _batch(seed: int) -> tuple[list[TokenChunk], torch.Tensor, torch.Tensor]:
    """Micro-batches of real token statistics (random logits over a small vocabulary, a sampled
    token per position, right-padded responses), rows of the groups shuffled across them, with
    DAPO's ±1 rewards normalised within each group."""
    g = torch.Generator().manual_seed(seed)
    groups = torch.arange(len(HITS)).repeat_interleave(K)
    correct = torch.cat([torch.arange(K) < hits for hits in HITS])
    order = torch.randperm(groups.numel(), generator=g)
    groups, correct = groups[order], correct[order]
    rewards = torch.where(correct, 1.0, -1.0)
    advantages = group_advantages(rewards, groups, True, False)
    chunks, start = [], 0
    for rows in MICRO_ROWS:
        width = 3 + int(torch.randint(6, (), generator=g))
        logits = torch.randn(rows, width, 11, generator=g) * 2.5
        logp = logits.log_softmax(-1)
        p = logp.exp()
        sampled = torch.multinomial(p.reshape(-1, 11), 1, generator=g).reshape(rows, width, 1)
        lengths = torch.randint(1, width + 1, (rows,), generator=g)
        chunks.append(
            TokenChunk(
                logprob=logp.gather(-1, sampled).squeeze(-1),
                entropy=-(p * logp).sum(-1),
                advantages=advantages[start : start + rows, None].expand(rows, width),
                mask=torch.arange(width) < lengths[:, None],
                sum_p2=p.square().sum(-1),
                sum_p2_logp=(p.square() * logp).sum(-1),
                sum_p3=p.pow(3).sum(-1),
                sum_p3_logp=(p.pow(3) * logp).sum(-1),
            )
        )
        start += rows
    return chunks, groups, correct


def _prepared(chunks: list[TokenChunk], estimator: str):
    config = method_config({"name": "opefo", "entropy_flow": {"estimator": estimator}})
    return prepare(build_objective(config), chunks, SingleProcessReducer())


def _reference(chunks, prepared, groups, correct) -> dict[int, dict[str, float]]:
    """Per group, with scalars only: its responses, correct ones, and the fsum of the positive
    and of the negative parts of ΔH over its masked tokens, with Σ|ΔH| (the terms' size)."""
    out: dict[int, dict[str, list[float] | int]] = {}
    row = 0
    for chunk, coefficients in zip(chunks, prepared.coefficients, strict=True):
        for r in range(chunk.mask.shape[0]):
            entry = out.setdefault(int(groups[row]), {"pos": [], "neg": [], "n": 0, "hits": 0})
            entry["n"] += 1
            entry["hits"] += bool(correct[row])
            for t in range(chunk.mask.shape[1]):
                if chunk.mask[r, t]:
                    dh = float(coefficients.delta_h[r, t])
                    entry["pos" if dh > 0 else "neg"].append(abs(dh))
            row += 1
    return {
        group: {
            "pos": math.fsum(e["pos"]),
            "neg": math.fsum(e["neg"]),
            "terms": len(e["pos"]) + len(e["neg"]),
            "abs": math.fsum(e["pos"]) + math.fsum(e["neg"]),
            "n": e["n"],
            "hits": e["hits"],
        }
        for group, e in out.items()
    }


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("seed", [0, 1])
def test_group_flows_are_the_sums_of_their_tokens_and_add_up_to_the_batch(estimator, seed):
    chunks, groups, correct = _batch(seed)
    prepared = _prepared(chunks, estimator)
    flows = group_flows(chunks, prepared, groups, correct)
    reference = _reference(chunks, prepared, groups, correct)
    assert [f.prompt for f in flows] == sorted(reference)
    for flow in flows:
        ref = reference[flow.prompt]
        assert (flow.responses, flow.correct) == (ref["n"], ref["hits"]) == (K, HITS[flow.prompt])
        # float64 sums of the same fp32 values in another order: n·u₆₄ of Σ|ΔH| at worst
        bound = ref["terms"] * U64 * ref["abs"]
        assert abs(flow.pos - ref["pos"]) <= bound and abs(flow.neg - ref["neg"]) <= bound
        if flow.correct in (0, K):  # equal rewards: A = 0 on every token, so ΔH = 0 exactly
            assert flow.pos == flow.neg == 0.0 and flow.lam is None
        else:
            assert flow.pos > 0 or flow.neg > 0
            lam = (ref["neg"] - ref["pos"]) / (ref["neg"] + ref["pos"])
            # λ* moves by at most the relative error of P and N (tests/metric_bounds.py)
            assert flow.lam == pytest.approx(lam, abs=bound / ref["abs"] + 4 * U64)
    terms = sum(r["terms"] for r in reference.values())
    size = sum(r["abs"] for r in reference.values())
    for side, name in (("pos", "flow/pos"), ("neg", "flow/neg")):
        total = sum(getattr(f, side) for f in flows)
        assert abs(total - prepared.metrics[name]) <= 2 * terms * U64 * size, side


def test_success_rate_bins_carry_their_groups_sums_and_lambda():
    chunks, groups, correct = _batch(2)
    flows = group_flows(chunks, _prepared(chunks, "paper"), groups, correct)
    bins = by_success_rate(flows)
    rates = sorted(set(HITS))
    assert [b.correct for b in bins] == rates and all(b.responses == K for b in bins)
    for b in bins:
        members = [f for f in flows if f.correct == b.correct]
        assert b.groups == len(members) == HITS.count(b.correct)
        pos, neg = sum(f.pos for f in members), sum(f.neg for f in members)
        assert (b.pos, b.neg) == pytest.approx((pos, neg), rel=4 * U64 * len(members))
        if b.correct in (0, K):
            assert b.pos == b.neg == 0.0 and b.lam is None
        else:
            assert b.lam == pytest.approx((neg - pos) / (neg + pos), abs=8 * U64)
    assert [b.success_rate for b in bins] == [r / K for r in rates]


def _result(flows: dict[str, list[GroupFlow]]) -> ProbeResult:
    estimators = {
        e: {
            "flow/pos": sum(f.pos for f in fs),
            "flow/neg": sum(f.neg for f in fs),
            "flow/lambda": 0.1,
        }
        for e, fs in flows.items()
    }
    rollout = {"reward/group_signal_frac": 0.5}
    signal = tuple(0 < hits < K for hits in HITS)  # ±1 rewards differ exactly when hits do
    return ProbeResult(len(HITS), K, "tabular", rollout, estimators, flows, signal)


def test_the_report_shows_the_success_rate_table_and_the_json_holds_every_group():
    chunks, groups, correct = _batch(3)
    flows = {e: group_flows(chunks, _prepared(chunks, e), groups, correct) for e in ESTIMATORS}
    result = _result(flows)
    text = success_rate_table(result)
    assert text in table(result)
    rows = text.splitlines()[2:]
    bins = {e: by_success_rate(fs) for e, fs in flows.items()}
    assert len(rows) == len(set(HITS))
    for line, *per_estimator in zip(rows, *bins.values(), strict=True):
        shown = per_estimator[list(ESTIMATORS).index("tabular")]
        cells = line.split()
        assert cells[:2] == [f"{shown.correct}/{K}", str(shown.groups)]
        assert cells[2:4] == [f"{shown.pos:.4g}", f"{shown.neg:.4g}"]
        assert cells[4:] == ["-" if b.lam is None else f"{b.lam:.4g}" for b in per_estimator]
    doc = document(result, [], {})["groups"]
    for estimator, fs in flows.items():
        stored = [(g["prompt"], g["correct"], g["pos"], g["neg"]) for g in doc[estimator]["groups"]]
        assert stored == [(f.prompt, f.correct, f.pos, f.neg) for f in fs]
        by_rate = doc[estimator]["by_success_rate"]
        assert [b["groups"] for b in by_rate] == [b.groups for b in bins[estimator]]
        assert [b["lambda"] for b in by_rate] == [b.lam for b in bins[estimator]]
        assert by_rate[0]["lambda"] is None and by_rate[-1]["lambda"] is None  # rates 0 and 1


def test_the_report_says_which_groups_dynamic_sampling_keeps():
    chunks, groups, correct = _batch(4)
    flows = {e: group_flows(chunks, _prepared(chunks, e), groups, correct) for e in ESTIMATORS}
    result = _result(flows)
    mixed = [g for g, hits in enumerate(HITS) if 0 < hits < K]
    line = f"dynamic sampling would keep {len(mixed)} of {len(HITS)} groups"
    assert line in table(result)
    doc = document(result, [], {})["dynamic_sampling"]
    assert doc["groups_with_signal"] == mixed and not doc["enabled"]
    # with dynamic sampling on, the batch is what it kept from the rounds it generated
    counts = {"rounds": 3.0, "groups_kept": 6.0, "groups_dropped": 10.0, "groups_surplus": 2.0}
    result.rollout.update({f"sampling/{name}": value for name, value in counts.items()})
    assert "dynamic sampling kept 6 groups with signal of 18 generated in 3 round(s)" in table(
        result
    )
    assert document(result, [], {})["dynamic_sampling"]["enabled"]
