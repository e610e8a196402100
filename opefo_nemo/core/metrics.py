"""spec §6 metrics as ratios of global sums, so that they reduce correctly over chunks and ranks.

Producers return 0-d float64 sums; callers add them over micro-batches and data-parallel ranks
and only then turn them into the logged figures here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor


def flow_metrics(
    sums: Mapping[str, Tensor], lam_star: float, net_after_balance: float
) -> dict[str, float]:
    """Entropy and entropy-flow metrics from the global sums of ``prepare`` (spec §3, §6).

    ``net_after_balance``: ``Σ_t w_t ΔH_t``, the predicted net flow of the weights the method
    applies (``P − N`` for a method that applies none).
    """
    n = float(sums["tokens"])
    pos, neg = float(sums["flow_pos"]), float(sums["flow_neg"])
    return {
        "entropy/mean": float(sums["entropy"]) / n,
        "flow/pos": pos,
        "flow/neg": neg,
        "flow/net": pos - neg,
        "flow/lambda": float(lam_star),
        "flow/frac_pos": float(sums["count_pos"]) / n,
        "flow/frac_neg": float(sums["count_neg"]) / n,
        "flow/net_after_balance": net_after_balance,
    }


def rollout_sums(rewards: Tensor, lengths: Tensor, truncated: Tensor) -> dict[str, Tensor]:
    """Per-response sums ``[B] → 0-d float64``: responses, reward, length, truncations."""
    return {
        "responses": torch.tensor(float(rewards.numel()), dtype=torch.float64),
        "reward": rewards.double().sum(),
        "length": lengths.double().sum(),
        "truncated": truncated.double().sum(),
    }


def rollout_metrics(sums: Mapping[str, Tensor]) -> dict[str, float]:
    """``reward/mean``, ``response/length_mean`` and ``response/clip_frac`` (spec §6)."""
    n = float(sums["responses"])
    if n == 0:
        raise ValueError("rollout metrics of an empty batch")
    return {
        "reward/mean": float(sums["reward"]) / n,
        "response/length_mean": float(sums["length"]) / n,
        "response/clip_frac": float(sums["truncated"]) / n,
    }


def add_sums(total: Mapping[str, Tensor], part: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Key-wise sum of two sum dictionaries with the same keys (an empty ``total`` starts one)."""
    if not total:
        return dict(part)
    if set(total) != set(part):
        raise ValueError(f"cannot add sums with keys {sorted(total)} and {sorted(part)}")
    return {name: total[name] + part[name] for name in total}


class RunningCorrelation:
    """Pearson correlation of the pairs ``(x, y)`` added so far (``flow/predictor_corr``: the
    predicted net flow against ``flow/realized``, spec §6).

    Co-moments are updated one pair at a time (Welford), so no history is kept; the state is three
    means-and-moments that a checkpoint stores as a dict.
    """

    def __init__(self) -> None:
        self.n, self.mean_x, self.mean_y = 0, 0.0, 0.0
        self.m_xx, self.m_yy, self.m_xy = 0.0, 0.0, 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        dx = x - self.mean_x
        self.mean_x += dx / self.n
        dy = y - self.mean_y
        self.mean_y += dy / self.n
        self.m_xx += dx * (x - self.mean_x)
        self.m_yy += dy * (y - self.mean_y)
        self.m_xy += dx * (y - self.mean_y)

    def value(self) -> float | None:
        """The correlation, or ``None`` with fewer than 3 pairs or a constant ``x`` or ``y``."""
        if self.n < 3 or self.m_xx <= 0 or self.m_yy <= 0:
            return None
        return self.m_xy / (self.m_xx * self.m_yy) ** 0.5

    def state_dict(self) -> dict[str, float]:
        return dict(vars(self))

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        for name in vars(self):
            setattr(self, name, state[name])
        self.n = int(self.n)


class EntropyDrift:
    """``flow/drift`` (spec §6): the change of the sampled entropy from one step to the next that
    the earlier step's update did not realize on its own batch.

    Step ``s`` sampled its batch with the policy ``θ_s`` (token-mean entropy ``H_s``, the
    ``entropy/mean`` of step ``s``) and, when measured, the update to ``θ_{s+1}`` changed that same
    batch's entropy by ``R_s`` (``flow/realized``). Step ``s + 1`` returns
    ``D_{s+1} = H_{s+1} − H_s − R_s``: the entropy of the new batch minus that of the old one, both
    under ``θ_{s+1}`` (new prompts, other responses), so that ``H_{s+1} − H_s = R_s + D_{s+1}``.
    Only when ``R_s`` was measured and both entropies are finite; otherwise ``None``.
    """

    def __init__(self) -> None:
        self.entropy: float | None = None
        self.realized: float | None = None

    def step(self, entropy: float, realized: float | None) -> float | None:
        """Record this step's sampled entropy and realized change (``None``: not measured);
        return the drift since the previous step, or ``None``."""
        drift = None
        if self.entropy is not None and self.realized is not None and math.isfinite(entropy):
            drift = entropy - self.entropy - self.realized
        finite = math.isfinite(entropy)
        self.entropy = entropy if finite else None
        self.realized = realized if finite and realized is not None else None
        return drift

    def state_dict(self) -> dict[str, float | None]:
        return {"entropy": self.entropy, "realized": self.realized}

    def load_state_dict(self, state: Mapping[str, float | None]) -> None:
        self.entropy, self.realized = state["entropy"], state["realized"]
