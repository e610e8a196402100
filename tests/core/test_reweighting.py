"""spec §6: the flows split by the sign of the advantage, the advantage shift of the applied
weights and the confident tokens' shares, from ``prepare``, against a float64 loop over tokens
written from the spec (tests/core/reference.py), and the mechanism's known value."""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import TokenChunk, build_objective, method_config, prepare
from tests.metric_bounds import assert_metrics_close

from . import reference as ref

FP32_EPS = torch.finfo(torch.float32).eps
METHODS = {
    "opefo": ({"name": "opefo"}, "adaptive"),
    "opefo_tabular": ({"name": "opefo", "entropy_flow": {"estimator": "tabular"}}, "adaptive"),
    "static": (
        {"name": "static", "entropy_flow": {"balance": "static", "static_lambda": 0.2}},
        "static",
    ),
    "pos_only": ({"name": "pos_only", "entropy_flow": {"balance": "pos_only"}}, "pos_only"),
    "neg_only": ({"name": "neg_only", "entropy_flow": {"balance": "neg_only"}}, "neg_only"),
    "grpo_strict": ({"name": "grpo_strict"}, "none"),
    "correct_only": ({"name": "correct_only"}, "correct"),
    "incorrect_only": ({"name": "incorrect_only"}, "incorrect"),
}
#: The advantage sign each one-sided method keeps (spec §5)
KEPT_SIGN = {"correct": 1, "incorrect": -1}
KEYS = (
    "flow/pos_adv_pos",
    "flow/pos_adv_neg",
    "flow/neg_adv_pos",
    "flow/neg_adv_neg",
    "flow/adv_shift",
    "flow/adv_shift_confident",
    "flow/confident_tokens",
    "flow/confident_abs_dh",
)


def token_batch(n: int, seed: int, zero_adv: float = 0.2) -> TokenChunk:
    """``n`` tokens, about a third confident (π(y) in (0.9, 1)); each entropy at least the least a
    distribution with ``π(y) = p`` can have, ``−p log p − (1−p) log(1−p)``, as for real logits."""
    g = torch.Generator().manual_seed(seed)
    confident = torch.rand(n, generator=g) < 0.35
    p = torch.where(
        confident,
        0.9 + 0.0999 * torch.rand(n, generator=g),
        0.01 + 0.85 * torch.rand(n, generator=g),
    ).double()
    least = -(p * p.log() + (1 - p) * (1 - p).log())
    entropy = least + torch.rand(n, generator=g, dtype=torch.float64) * 1.5
    adv = torch.randn(n, generator=g)
    adv[torch.rand(n, generator=g) < zero_adv] = 0.0
    s2 = p.square() + (1 - p).square() * torch.rand(n, generator=g, dtype=torch.float64)
    return TokenChunk(
        logprob=p.log().float(),
        entropy=entropy.float(),
        advantages=adv,
        mask=torch.rand(n, generator=g) > 0.15,
        sum_p2=s2.float(),
        sum_p2_logp=(s2 * p.log()).float(),
    )


def loop_reference(chunk: TokenChunk, name: str, confident_prob: float) -> dict[str, float]:
    """spec §6's figures, token by token in Python floats (w from spec §3's table)."""
    spec, balance = METHODS[name]
    tabular = spec.get("entropy_flow", {}).get("estimator") == "tabular"
    lp, h = chunk.logprob.double().tolist(), chunk.entropy.double().tolist()
    adv, mask = chunk.advantages.double().tolist(), chunk.mask.tolist()
    s2, s2l = chunk.sum_p2.double().tolist(), chunk.sum_p2_logp.double().tolist()
    dh = [
        ref.delta_h_tabular(lp[i], h[i], adv[i], s2[i], s2l[i])
        if tabular
        else ref.delta_h_paper(lp[i], h[i], adv[i])
        for i in range(len(lp))
    ]
    pos, neg = ref.flow(dh, mask)
    if balance == "none":
        w = [1.0] * len(dh)
    elif balance in KEPT_SIGN:
        w = [1.0 if KEPT_SIGN[balance] * a > 0 else 0.0 for a in adv]
    else:
        static = spec.get("entropy_flow", {}).get("static_lambda", 0.001)
        w = ref.weights(dh, mask, pos, neg, balance, static)
    split = {"pp": 0.0, "pn": 0.0, "np": 0.0, "nn": 0.0}
    count = tokens = conf_dh = abs_a = conf_a = shift = conf_shift = 0.0
    for i in range(len(dh)):
        if not mask[i]:
            continue
        tokens += 1
        abs_a += abs(adv[i])
        side = "p" if dh[i] > 0 else "n" if dh[i] < 0 else None
        sign = "p" if adv[i] > 0 else "n" if adv[i] < 0 else None
        if side and sign:
            split[side + sign] += abs(dh[i])
        shift += (w[i] - 1) * adv[i]
        if math.exp(lp[i]) > confident_prob:
            count += 1
            conf_dh += abs(dh[i])
            conf_a += abs(adv[i])
            conf_shift += (w[i] - 1) * adv[i]
    return {
        "flow/pos_adv_pos": split["pp"],
        "flow/pos_adv_neg": split["pn"],
        "flow/neg_adv_pos": split["np"],
        "flow/neg_adv_neg": split["nn"],
        "flow/adv_shift": shift / abs_a,
        "flow/adv_shift_confident": conf_shift / conf_a,
        "flow/confident_tokens": count / tokens,
        "flow/confident_abs_dh": conf_dh / (pos + neg),
        "flow/lambda": ref.lam_star(pos, neg),
        "flow/pos": pos,
        "flow/neg": neg,
    }


def prepared_metrics(chunks, name: str, confident_prob: float = 0.9) -> dict[str, float]:
    objective = build_objective(method_config(METHODS[name][0]))
    return prepare(objective, chunks, SingleProcessReducer(), confident_prob=confident_prob).metrics


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize(("seed", "confident_prob"), [(0, 0.9), (1, 0.9), (2, 0.5), (3, 0.97)])
def test_metrics_equal_the_loop_reference(name, seed, confident_prob):
    chunk = token_batch(400, seed)
    want = loop_reference(chunk, name, confident_prob)
    got = prepared_metrics([chunk], name, confident_prob)
    assert 20 <= want["flow/confident_tokens"] * chunk.mask.sum() <= 380  # both kinds present
    # ΔH is fp32 in prepare, float64 here; the applied weights 1 ± λ are fp32: every figure is
    # within a few fp32 roundings of its terms' magnitude (tests/metric_bounds.py)
    assert_metrics_close({k: got[k] for k in want}, want, rel=1e-5)
    if name == "grpo_strict":
        assert got["flow/adv_shift"] == got["flow/adv_shift_confident"] == 0.0


@pytest.mark.parametrize("name", ["opefo", "opefo_tabular", "grpo_strict"])
def test_the_split_adds_up_to_p_and_n(name):
    got = prepared_metrics([token_batch(500, 7, zero_adv=0.4)], name)
    pos, neg = got["flow/pos"], got["flow/neg"]
    assert got["flow/pos_adv_pos"] + got["flow/pos_adv_neg"] == pytest.approx(pos, rel=1e-12)
    assert got["flow/neg_adv_pos"] + got["flow/neg_adv_neg"] == pytest.approx(neg, rel=1e-12)
    assert min(got[k] for k in KEYS[:4]) > 0  # each of the four sides holds flow here


@pytest.mark.parametrize("seed", range(4))
def test_paper_opefo_shifts_the_confident_tokens_by_minus_lambda(seed):
    """The mechanism: a confident token has ``log π + H > 0``, so the paper's ΔH has the sign of
    ``−A``: in a right response (A > 0) it is in S− and gets ``1 − λ*``, in a wrong one S+ and
    ``1 + λ*``. Then ``Σ_conf (w − 1) A = −λ* Σ_conf |A|``: the shift over the confident tokens is
    exactly ``−λ*``, whatever the advantages."""
    chunk = token_batch(300, seed)
    got = prepared_metrics([chunk], "opefo")
    lam = got["flow/lambda"]
    assert abs(lam) > 0.05
    # the fp32 weights 1 ± λ* each carry at most ε₃₂/2 of rounding relative to 1 + |λ*|
    assert got["flow/adv_shift_confident"] == pytest.approx(-lam, abs=FP32_EPS * (1 + abs(lam)))


def test_layout_of_the_chunks_does_not_change_the_metrics():
    chunk = token_batch(300, 11)
    pieces = [
        TokenChunk(
            **{
                f: None if getattr(chunk, f) is None else getattr(chunk, f)[rows]
                for f in ("logprob", "entropy", "advantages", "mask", "sum_p2", "sum_p2_logp")
            }
        )
        for rows in (slice(0, 17), slice(17, 150), slice(150, 300))
    ]
    for name in ("opefo", "static"):
        whole, split = prepared_metrics([chunk], name), prepared_metrics(pieces, name)
        assert_metrics_close({k: split[k] for k in KEYS}, {k: whole[k] for k in KEYS}, rel=1e-12)


def test_without_advantages_or_confident_tokens_the_ratios_are_zero():
    chunk = token_batch(50, 3)
    still = TokenChunk(chunk.logprob, chunk.entropy, torch.zeros_like(chunk.advantages), chunk.mask)
    got = prepared_metrics([still], "opefo")
    assert all(got[k] == 0.0 for k in KEYS if k != "flow/confident_tokens")
    unsure = TokenChunk(
        chunk.logprob.clamp(max=math.log(0.5)), chunk.entropy, chunk.advantages, chunk.mask
    )
    got = prepared_metrics([unsure], "opefo")
    assert got["flow/confident_tokens"] == got["flow/adv_shift_confident"] == 0.0


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_a_confident_prob_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="confident_prob"):
        prepared_metrics([token_batch(20, 0)], "opefo", bad)
