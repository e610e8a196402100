"""``opefo`` (spec §3, §5): strict GRPO with the entropy-increasing and entropy-decreasing tokens
reweighted so that the predicted net entropy flow is zero (``adaptive``) or steers the batch
entropy toward a target (``target``); the weights: :mod:`.balanced_policy_gradient`."""

from __future__ import annotations

from opefo_nemo.core.objectives.methods.balanced_policy_gradient import BalancedPolicyGradient
from opefo_nemo.core.objectives.registry import register_objective


@register_objective("opefo")
class Opefo(BalancedPolicyGradient):
    """OPEFO (paper §4): strict on-policy, ``−w_t A_t log π(y_t)`` with ``w = 1 ± λ`` on the
    entropy-increasing and entropy-decreasing tokens (spec §3): ``balance: adaptive``, λ = λ*
    (zero predicted net flow), or ``target``, ``λ = clip(λ* + g (H_target − H_batch), −1, 1)``:
    the predicted net flow ``g (H_target − H_batch)(P + N)`` steers the batch entropy toward
    ``H_target``."""

    balances = ("adaptive", "target")
