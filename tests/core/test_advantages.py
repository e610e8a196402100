"""spec §4: group advantages against a loop reference, and their edge cases; the share of groups
with signal against a loop over groups."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.core import group_advantages
from opefo_nemo.core.advantages import group_signal, signal_fraction
from tests.metric_bounds import U32

from . import reference as ref


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("leave_one_out", [False, True])
def test_group_advantages_match_loop_reference(normalize_std, leave_one_out):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (40,), generator=g).float() + torch.rand(40, generator=g) * 0.1
    groups = torch.tensor([7, 3, 3, 9, 7, 1] * 6 + [42, 5, 5, 5])
    got = group_advantages(rewards, groups, normalize_std, leave_one_out)
    expected = ref.advantages(rewards.tolist(), groups.tolist(), normalize_std, leave_one_out)
    # r − mean cancels: a few fp32 roundings of the terms |r| + max|r| of the group, over its std
    for i, (value, want) in enumerate(zip(got.tolist(), expected, strict=True)):
        members = rewards[groups == groups[i]].double()
        spread = float(members.std()) + 1e-6 if normalize_std and len(members) > 1 else 1.0
        terms = (abs(float(rewards[i])) + float(members.abs().max())) / spread
        assert abs(value - want) <= 16 * U32 * terms, i


def test_equal_rewards_and_singletons_give_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.5])
    groups = torch.tensor([0, 0, 0, 1, 2])
    for loo in (False, True):
        assert torch.equal(group_advantages(rewards, groups, leave_one_out=loo), torch.zeros(5))


def test_binary_group_of_eight_has_known_values():
    rewards = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0])
    adv = group_advantages(rewards, torch.zeros(8, dtype=torch.long))
    std = (1 / 8) ** 0.5  # unbiased std of one 1 and seven 0: sqrt((7/64 + 7·1/64)/7)
    assert adv[0].item() == pytest.approx((1 - 1 / 8) / (std + 1e-6), rel=1e-6)
    assert adv[1].item() == pytest.approx((-1 / 8) / (std + 1e-6), rel=1e-6)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"rewards has 1 non-finite"):
        group_advantages(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"group_ids has shape \(3,\)"):
        group_advantages(torch.ones(2), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="integers"):
        group_advantages(torch.ones(2), torch.zeros(2))


@pytest.mark.parametrize("seed", range(5))
def test_signal_fraction_counts_groups_whose_rewards_differ(seed):
    generator = torch.Generator().manual_seed(seed)
    group_ids = torch.randint(0, 7, (40,), generator=generator) * 3 - 5  # any integer ids
    rewards = torch.randint(0, 2, (40,), generator=generator).float()
    groups = {}
    for g, r in zip(group_ids.tolist(), rewards.tolist(), strict=True):
        groups.setdefault(g, set()).add(r)
    expected = sum(len(values) > 1 for values in groups.values()) / len(groups)
    assert signal_fraction(rewards, group_ids) == pytest.approx(expected, abs=1e-12)
    # per group, in the order of the sorted ids: the groups dynamic sampling keeps
    assert group_signal(rewards, group_ids).tolist() == [len(groups[g]) > 1 for g in sorted(groups)]


def test_signal_fraction_of_the_issue_batch():
    rewards = torch.zeros(32 * 8)
    for group in range(21):  # 21 of 32 groups with one right answer
        rewards[group * 8] = 1.0
    assert signal_fraction(rewards, torch.arange(256) // 8) == 21 / 32
