"""spec §6 ``clip/*``: counts and ΔH sums of the tokens the ratio clip actually clipped.

A token is clipped when its loss takes the clipped branch of ``max(−A ρ, −A clip(ρ))`` strictly,
so its gradient is cut; the dual clip is active on a token with ``A < 0`` whose clipped loss
exceeds ``−c A``. Methods whose loss has no ratio clip (KL-Cov: ``−A ρ`` + penalty; the strict
methods, where ρ ≡ 1) log no ``clip/*`` metric.
"""

from __future__ import annotations

import math

import pytest

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import policy_loss, prepare, step_loss_metrics
from tests.core import reference as ref
from tests.core.chunks import METHOD_SETTINGS, batch, method
from tests.metric_bounds import assert_metrics_close, term_scale

CLIPPING_METHODS = ("grpo", "clip_higher", "entropy_reg", "clip_cov", "steer")


def reference_clip_metrics(name: str, cfg, chunk) -> dict[str, float]:
    """Loop over tokens: which branch of the clipped surrogate each valid token takes."""
    counts = {"upper": 0, "lower": 0, "dual": 0}
    dh = {"upper": 0.0, "lower": 0.0}
    n = 0
    for i in range(len(chunk.mask)):
        if not chunk.mask[i]:
            continue
        n += 1
        lp, a = float(chunk.logprob[i]), float(chunk.advantages[i])
        old = lp if chunk.old_logprob is None else float(chunk.old_logprob[i])
        rho = math.exp(lp - old)
        clipped = min(max(rho, 1 - cfg.clip_eps_low), 1 + cfg.clip_eps_high)
        c = cfg.clip_ratio_c
        if c is not None and a < 0 and max(-a * rho, -a * clipped) > -c * a:
            counts["dual"] += 1
        if not -a * clipped > -a * rho:
            continue
        side = "upper" if rho > 1 else "lower"
        counts[side] += 1
        dh[side] += ref.delta_h_paper(lp, float(chunk.entropy[i]), a)
    return {
        "clip/frac_upper": counts["upper"] / n,
        "clip/frac_lower": counts["lower"] / n,
        "clip/dh_upper": dh["upper"],
        "clip/dh_lower": dh["lower"],
        "clip/frac_dual": counts["dual"] / n,
    }


@pytest.mark.parametrize("name", sorted(METHOD_SETTINGS))
def test_clip_metrics_count_only_tokens_the_loss_clipped(name):
    cfg = method(name)
    chunk = batch(n=400, seed=11, multi_update=not cfg.config.strict_on_policy)
    prepared = prepare(cfg, [chunk], SingleProcessReducer(), seed=1)
    out = policy_loss(
        cfg,
        chunk.logprob,
        chunk.advantages,
        chunk.mask,
        prepared.coefficients[0],
        prepared.n_tokens,
        old_logprob=chunk.old_logprob,
        entropy=chunk.entropy,
    )
    got = step_loss_metrics(cfg, out.sums, prepared.n_tokens)
    if name not in CLIPPING_METHODS:
        assert not [key for key in got if key.startswith("clip/")]
        return
    expected = reference_clip_metrics(name, cfg.config, chunk)
    if name in ("grpo", "clip_higher"):
        assert expected["clip/frac_upper"] > 0 and expected["clip/frac_lower"] > 0
    if name == "clip_higher":  # its c = 1.5 (METHOD_SETTINGS): the dual clip bites
        assert expected["clip/frac_dual"] > 0
    # the ΔH sums of the clipped tokens within round-off of their terms, the flows P + N
    flows = {key: term_scale(key, prepared.metrics) for key in ("clip/dh_upper", "clip/dh_lower")}
    assert_metrics_close({key: got[key] for key in expected}, expected, rel=1e-5, scales=flows)
