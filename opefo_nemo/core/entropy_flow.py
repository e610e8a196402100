"""Per-token entropy change ΔH_t, entropy-flow sums and the balancing coefficient λ* (spec §2–§3).
Nothing here communicates: :func:`flow_sums` gives *local* sums, :func:`balance` takes *global*
ones; ΔH and λ* are statistics, never differentiated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from opefo_nemo.core.tensor_checks import as_bool_mask, check_finite, check_same_shape

#: The vocabulary sums (``TokenStats`` field names) each ΔH estimator needs from ``token_stats``.
ESTIMATOR_SUMS: dict[str, tuple[str, ...]] = {
    "paper": (),
    "tabular": ("sum_p2", "sum_p2_logp"),
    "expectation": ("sum_p2", "sum_p2_logp", "sum_p3", "sum_p3_logp"),
}
ESTIMATORS = tuple(ESTIMATOR_SUMS)
BALANCES = ("adaptive", "target", "static", "pos_only", "neg_only", "none")
LAMBDA_EPS = 1e-12


@torch.no_grad()
def delta_entropy(
    logprob: Tensor,
    entropy: Tensor,
    advantages: Tensor,
    estimator: str = "paper",
    sum_p2: Tensor | None = None,
    sum_p2_logp: Tensor | None = None,
    sum_p3: Tensor | None = None,
    sum_p3_logp: Tensor | None = None,
) -> Tensor:
    """First-order entropy change of each token's state under its own policy-gradient step.

    spec §2, with ``p = exp(logprob)``, ``s2 = Σπ²``, ``s2l = Σπ² log π``, ``s3 = Σπ³``,
    ``s3l = Σπ³ log π`` over the vocabulary, and the learning rate η omitted:

    * ``paper``:   ``ΔH = −A (1 − p)² (logprob + H)`` (the paper's Eq. 5 at the sampled token);
    * ``tabular``: ``ΔH = −A [p (logprob + H) − (s2l + H s2)]``, the exact first-order change
      of ``H(·|s)`` for the logit step ``A (onehot(y) − π)``; needs ``sum_p2``, ``sum_p2_logp``;
    * ``expectation``: ``ΔH = −A Σ_a π(a)(1 − π(a))² (log π(a) + H)``, the paper's integrand
      averaged over the token drawn from ``π`` instead of taken at the sampled one. Expanding
      ``(1 − π)² = 1 − 2π + π²`` and using ``Σ π log π = −H``:
      ``Σ_a π(1 − π)²(log π + H) = −2 (s2l + H s2) + (s3l + H s3)``; needs all four sums.
      The sum is ``Cov_π((1 − π)², log π) ≤ 0`` (a decreasing and an increasing function of
      ``π(a)``), so this ΔH always has the sign of ``A`` (or is 0).

    All inputs have the same shape ``[*]``; the result is fp32 of that shape, without gradient.
    ``ESTIMATOR_SUMS[estimator]`` names the sums an estimator needs; a missing one is an error
    naming it.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown entropy estimator {estimator!r}; expected one of {ESTIMATORS}")
    given = {
        "sum_p2": sum_p2,
        "sum_p2_logp": sum_p2_logp,
        "sum_p3": sum_p3,
        "sum_p3_logp": sum_p3_logp,
    }
    needed = ESTIMATOR_SUMS[estimator]
    missing = [name for name in needed if given[name] is None]
    if missing:
        raise ValueError(
            f"the {estimator!r} estimator needs {', '.join(needed)} from token_stats; "
            f"missing: {', '.join(missing)}"
        )
    check_same_shape("logprob", logprob, entropy=entropy, advantages=advantages)
    check_same_shape("logprob", logprob, **{name: given[name] for name in needed})
    for name, tensor in (("logprob", logprob), ("entropy", entropy), ("advantages", advantages)):
        check_finite(name, tensor)
    for name in needed:
        check_finite(name, given[name])
    lp = logprob.detach().float()
    h = entropy.detach().float()
    adv = advantages.detach().float()
    present = {name: tensor for name, tensor in given.items() if tensor is not None}
    s = {name: present[name].detach().float() for name in needed}
    if estimator == "paper":
        return -adv * (1.0 - lp.exp()).square() * (lp + h)
    centred_p2 = s["sum_p2_logp"] + h * s["sum_p2"]
    if estimator == "tabular":
        return -adv * (lp.exp() * (lp + h) - centred_p2)
    centred_p3 = s["sum_p3_logp"] + h * s["sum_p3"]
    return -adv * (centred_p3 - 2.0 * centred_p2)


@torch.no_grad()
def flow_sums(delta_h: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Local entropy-flow sums over the masked tokens (spec §3), as 0-d float64 tensors.

    ``P = Σ_{ΔH>0} ΔH`` and ``N = Σ_{ΔH<0} |ΔH|``. Sums of disjoint chunks add up to the sums of
    their union, so callers add them over micro-batches and data-parallel ranks.
    """
    pos, neg = _signed_flows(delta_h, mask)
    return pos.sum(), neg.sum()


@torch.no_grad()
def group_flow_sums(
    delta_h: Tensor, mask: Tensor, groups: Tensor, n_groups: int
) -> tuple[Tensor, Tensor]:
    """:func:`flow_sums` of each group of rows: ``delta_h`` and ``mask`` ``[rows, *]``, ``groups``
    ``[rows]`` the group of each row in ``[0, n_groups)``. Returns ``(P_g, N_g)``, float64
    ``[n_groups]``; over the groups they add up to :func:`flow_sums` of the whole chunk (up to
    the order of the float64 additions)."""
    pos, neg = _signed_flows(delta_h, mask)
    rows = delta_h.shape[0] if delta_h.dim() else -1
    if tuple(groups.shape) != (rows,) or torch.is_floating_point(groups):
        raise ValueError(f"groups must be integers of shape ({rows},), got {tuple(groups.shape)}")
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=delta_h.device)
    index = groups.to(delta_h.device, torch.long)
    return (
        zeros.index_add(0, index, pos.reshape(rows, -1).sum(dim=1)),
        zeros.index_add(0, index, neg.reshape(rows, -1).sum(dim=1)),
    )


def _signed_flows(delta_h: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per token ``max(ΔH, 0)`` and ``max(−ΔH, 0)`` (float64, 0 outside ``mask``): the terms of P
    and N."""
    check_same_shape("delta_h", delta_h, mask=mask)
    check_finite("delta_h", delta_h)
    dh = delta_h.detach().double() * as_bool_mask(mask)
    return dh.clamp(min=0), (-dh).clamp(min=0)


def lambda_star(P: Tensor | float, N: Tensor | float, eps: float = LAMBDA_EPS) -> Tensor:
    """Balancing coefficient ``λ* = (N − P) / max(N + P, eps)`` from *global* sums (spec §3).

    λ* ∈ [−1, 1]; it makes ``(1 + λ*) P − (1 − λ*) N = 0`` whenever ``N + P > 0``, and is 0 when
    there is no flow. Returns a 0-d float64 tensor.
    """
    pos_t = torch.as_tensor(P, dtype=torch.float64)
    neg_t = torch.as_tensor(N, dtype=torch.float64)
    if pos_t.dim() or neg_t.dim():
        raise ValueError("lambda_star takes the scalar global sums P and N")
    if bool(pos_t < 0) or bool(neg_t < 0):
        raise ValueError(f"flow sums must be non-negative, got P={float(pos_t)}, N={float(neg_t)}")
    return (neg_t - pos_t) / (neg_t + pos_t).clamp(min=eps)


def target_shift(mean_entropy: float, target_entropy: float, gain: float) -> float:
    """``g · (H_target − H_batch)``: how far ``balance="target"`` moves λ from λ* (spec §3)."""
    return gain * (target_entropy - mean_entropy)


def side_weights(
    P: Tensor | float,
    N: Tensor | float,
    balance: str = "adaptive",
    static_lambda: float = 0.001,
    shift: float = 0.0,
    eps: float = LAMBDA_EPS,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(λ, w₊, w₋)``: the coefficient a variant applies and the weights of S+ and S− (spec §3).

    ``λ`` is λ* for every variant but two: ``static`` applies ``static_lambda``, and ``target``
    applies ``clip(λ* + shift, −1, 1)`` with ``shift`` from :func:`target_shift`, so that the
    predicted net flow ``(1+λ)P − (1−λ)N = shift · (P + N)`` (before clipping) steers the entropy
    toward its target; ``shift = 0`` is ``adaptive``. ``none`` applies no weight but still reports
    λ*. All three are 0-d float64 tensors.
    """
    if balance not in BALANCES:
        raise ValueError(f"unknown entropy_flow.balance {balance!r}; expected one of {BALANCES}")
    lam = torch.tensor(float(static_lambda), dtype=torch.float64)
    if balance != "static":
        lam = lambda_star(P, N, eps)
    if balance == "target":
        lam = (lam + float(shift)).clamp(-1.0, 1.0)
    one = torch.ones((), dtype=torch.float64)
    w_pos = one + lam if balance in ("adaptive", "target", "static", "pos_only") else one
    w_neg = one - lam if balance in ("adaptive", "target", "static", "neg_only") else one
    return lam, w_pos, w_neg


@torch.no_grad()
def balance(
    delta_h: Tensor,
    mask: Tensor,
    P: Tensor | float,
    N: Tensor | float,
    balance: str = "adaptive",
    static_lambda: float = 0.001,
    shift: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Per-token weights ``w_t`` and the applied λ, from the *global* flow sums P and N (spec §3).

    ``w_t = w₊`` on S+ (ΔH > 0), ``w₋`` on S− (ΔH < 0), and 1 on tokens with ΔH = 0 or outside
    ``mask``; ``shift`` only for ``target`` (:func:`side_weights`). Returns ``(weights [*] fp32,
    λ 0-d float64)``; neither carries gradient.
    """
    check_same_shape("delta_h", delta_h, mask=mask)
    lam, w_pos, w_neg = side_weights(P, N, balance, static_lambda, shift)
    valid = as_bool_mask(mask)
    weights = torch.ones_like(delta_h, dtype=torch.float32)
    weights = torch.where(valid & (delta_h > 0), w_pos.float(), weights)
    weights = torch.where(valid & (delta_h < 0), w_neg.float(), weights)
    return weights, lam
