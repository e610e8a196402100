"""Group-relative advantages (spec §4), vectorised over groups with scatter sums.

A group is the K responses sampled for one prompt. Rewards and group ids are per response
(``[B]``); the advantage of a response is later broadcast to its response tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from opefo_nemo.core.tensor_checks import check_finite, check_same_shape

STD_EPS = 1e-6


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    normalize_std: bool = True,
    leave_one_out: bool = False,
) -> Tensor:
    """Advantages ``[B]`` (fp32) of responses ``[B]`` grouped by ``group_ids`` ``[B]`` (any ints).

    * default (GRPO): ``A_i = (r_i − mean_g) / (std_g + 1e-6)``, std unbiased (n − 1);
    * ``normalize_std=False`` (Dr. GRPO): ``A_i = r_i − mean_g``;
    * ``leave_one_out=True``: the baseline is the mean of the other ``n − 1`` rewards (divided by
      ``std_g + 1e-6`` too when ``normalize_std``).

    A group of one has advantage 0; a group of equal rewards has all-zero advantages.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-d [B], got shape {tuple(rewards.shape)}")
    check_same_shape("rewards", rewards, group_ids=group_ids)
    check_finite("rewards", rewards)
    if torch.is_floating_point(group_ids):
        raise ValueError(f"group_ids must be integers, got dtype {group_ids.dtype}")
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=rewards.device)

    r = rewards.double()
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(
        0, group, torch.ones_like(r)
    )
    total = torch.zeros_like(count).index_add_(0, group, r)
    n = count[group]
    mean = (total / count)[group]
    singleton = n < 2

    if leave_one_out:
        baseline = (total[group] - r) / torch.where(singleton, torch.ones_like(n), n - 1)
        centered = r - baseline
    else:
        centered = r - mean
    if normalize_std:
        squares = torch.zeros_like(count).index_add_(0, group, (r - mean).square())
        var = squares[group] / torch.where(singleton, torch.ones_like(n), n - 1)
        centered = centered / (var.sqrt() + STD_EPS)
    return torch.where(singleton, torch.zeros_like(centered), centered).float()


def group_signal(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``[G]`` bool, in the order of the sorted group ids (``torch.unique``'s): whether the
    rewards ``[B]`` of each group (``group_ids`` ``[B]``) are not all equal, i.e. whether its
    advantages are not all zero, the only groups that move a group-relative policy gradient."""
    check_same_shape("rewards", rewards, group_ids=group_ids)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1
    r = rewards.double()
    low = torch.full((n_groups,), float("inf"), dtype=torch.float64).scatter_reduce(
        0, group, r, "amin"
    )
    high = torch.full((n_groups,), float("-inf"), dtype=torch.float64).scatter_reduce(
        0, group, r, "amax"
    )
    return high > low


def signal_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Share of the groups (``group_ids`` ``[B]``) whose rewards ``[B]`` are not all equal
    (:func:`group_signal`)."""
    if rewards.numel() == 0:
        raise ValueError("signal_fraction of an empty batch")
    return float(group_signal(rewards, group_ids).double().mean())
