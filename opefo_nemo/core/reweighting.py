"""What a reweighting does to a batch (spec §6): the flows P and N split by the sign of the
advantage, the advantage shift of the applied weights, and the confident tokens' share. The
functions return *local* 0-d float64 sums; only :func:`reweighting_metrics` reads global ones.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from opefo_nemo.core.tensor_checks import as_bool_mask, check_same_shape

DEFAULT_CONFIDENT_PROB = 0.9
#: The sums of :func:`split_sums` (computed with the flow sums, before any weight exists).
SPLIT_SUMS = (
    "pos_adv_pos",
    "pos_adv_neg",
    "neg_adv_pos",
    "neg_adv_neg",
    "confident_tokens",
    "confident_abs_dh",
    "abs_adv",
    "confident_abs_adv",
)
#: The sums of :func:`shift_sums` (computed from the applied weights).
SHIFT_SUMS = ("adv_shift", "adv_shift_confident")


def confident_tokens(logprob: Tensor, mask: Tensor, confident_prob: float) -> Tensor:
    """Boolean ``[*]``: masked tokens with ``exp(logprob_t) > confident_prob``."""
    check_same_shape("logprob", logprob, mask=mask)
    return as_bool_mask(mask) & (logprob.detach().double().exp() > confident_prob)


@torch.no_grad()
def split_sums(
    delta_h: Tensor, advantages: Tensor, logprob: Tensor, mask: Tensor, confident_prob: float
) -> dict[str, Tensor]:
    """Local sums of :data:`SPLIT_SUMS` over the masked tokens (all inputs ``[*]``).

    ``pos_adv_pos = Σ_{ΔH>0, A>0} ΔH``, ``pos_adv_neg = Σ_{ΔH>0, A<0} ΔH``,
    ``neg_adv_pos = Σ_{ΔH<0, A>0} |ΔH|``, ``neg_adv_neg = Σ_{ΔH<0, A<0} |ΔH|`` (every estimator's
    ΔH is 0 where A is, so the first two add up to P and the last two to N);
    ``confident_tokens``: their count; ``confident_abs_dh = Σ_conf |ΔH|``;
    ``abs_adv = Σ |A|`` and ``confident_abs_adv = Σ_conf |A|``.
    """
    check_same_shape("delta_h", delta_h, advantages=advantages, logprob=logprob, mask=mask)
    valid = as_bool_mask(mask)
    dh, adv = delta_h.detach().double(), advantages.detach().double()
    confident = confident_tokens(logprob, valid, confident_prob)
    pos, neg = valid & (dh > 0), valid & (dh < 0)
    up, down = adv > 0, adv < 0
    return {
        "pos_adv_pos": (dh * (pos & up)).sum(),
        "pos_adv_neg": (dh * (pos & down)).sum(),
        "neg_adv_pos": (-dh * (neg & up)).sum(),
        "neg_adv_neg": (-dh * (neg & down)).sum(),
        "confident_tokens": confident.sum().double(),
        "confident_abs_dh": (dh.abs() * confident).sum(),
        "abs_adv": (adv.abs() * valid).sum(),
        "confident_abs_adv": (adv.abs() * confident).sum(),
    }


@torch.no_grad()
def shift_sums(
    weight: Tensor, advantages: Tensor, logprob: Tensor, mask: Tensor, confident_prob: float
) -> dict[str, Tensor]:
    """Local ``Σ_t (w_t − 1) A_t`` over the masked tokens (``adv_shift``) and over the confident
    ones (``adv_shift_confident``); ``w_t`` are the weights the method applies (all ``[*]``)."""
    check_same_shape("weight", weight, advantages=advantages, logprob=logprob, mask=mask)
    valid = as_bool_mask(mask)
    shift = (weight.detach().double() - 1.0) * advantages.detach().double()
    confident = confident_tokens(logprob, valid, confident_prob)
    return {"adv_shift": (shift * valid).sum(), "adv_shift_confident": (shift * confident).sum()}


def _ratio(numerator: Tensor | float, denominator: Tensor | float) -> float:
    """``numerator / denominator``, 0 when the denominator is 0 (nothing to share)."""
    denominator = float(denominator)
    return float(numerator) / denominator if denominator > 0 else 0.0


def reweighting_metrics(
    sums: Mapping[str, Tensor], shifts: Mapping[str, Tensor]
) -> dict[str, float]:
    """spec §6 figures from the *global* sums: ``sums`` holds ``tokens``, ``flow_pos``,
    ``flow_neg`` and :data:`SPLIT_SUMS`, ``shifts`` holds :data:`SHIFT_SUMS`.

    ``flow/adv_shift = Σ (w − 1) A / Σ |A|`` (all tokens) and ``flow/adv_shift_confident`` (the
    same over the confident tokens); ``flow/confident_tokens``: their share of the tokens;
    ``flow/confident_abs_dh``: their share of ``Σ |ΔH| = P + N``. A ratio with nothing in its
    denominator is 0.
    """
    flow = float(sums["flow_pos"]) + float(sums["flow_neg"])
    return {
        "flow/pos_adv_pos": float(sums["pos_adv_pos"]),
        "flow/pos_adv_neg": float(sums["pos_adv_neg"]),
        "flow/neg_adv_pos": float(sums["neg_adv_pos"]),
        "flow/neg_adv_neg": float(sums["neg_adv_neg"]),
        "flow/adv_shift": _ratio(shifts["adv_shift"], sums["abs_adv"]),
        "flow/adv_shift_confident": _ratio(
            shifts["adv_shift_confident"], sums["confident_abs_adv"]
        ),
        "flow/confident_tokens": _ratio(sums["confident_tokens"], sums["tokens"]),
        "flow/confident_abs_dh": _ratio(sums["confident_abs_dh"], flow),
    }
