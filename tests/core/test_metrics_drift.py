"""``flow/drift`` (spec §6) against a brute force: a hand-built table of every batch's entropy
under every policy, from which the sampled entropies, the realized changes and the drift follow
by definition (the drift: the new batch's entropy minus the old batch's, under one policy)."""

from __future__ import annotations

import math
import random

import pytest

from opefo_nemo.core.metrics import EntropyDrift

STEPS = 12
#: Entropies lie in [0.1, 2]: a drift is three fp64 roundings of terms up to 4 in magnitude.
BOUND = 3 * 2**-53 * 4.0


def entropy_table(seed: int) -> list[list[float]]:
    """``table[j][s]``: token-mean entropy of step s's batch under the policy θ_j of step j."""
    rng = random.Random(seed)
    return [[rng.uniform(0.1, 2.0) for _ in range(STEPS)] for _ in range(STEPS + 1)]


def feed(table, measured, nonfinite=()):
    """Run :class:`EntropyDrift` over the steps as the trainer does: step s's sampled entropy is
    ``table[s][s]`` (its own batch under the policy that sampled it), its realized change
    ``table[s + 1][s] − table[s][s]`` where measured (a non-finite step measures none)."""
    drift = EntropyDrift()
    out = []
    for s in range(STEPS):
        entropy = math.nan if s in nonfinite else table[s][s]
        realized = table[s + 1][s] - table[s][s] if s in measured and s not in nonfinite else None
        out.append(drift.step(entropy, realized))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_drift_is_the_new_batch_minus_the_old_under_one_policy(seed):
    table = entropy_table(seed)
    measured = {0, 1, 2, 5, 8, 9}
    got = feed(table, measured)
    for s in range(STEPS):
        if s - 1 in measured:  # logged at the step after the one that measured realized
            expected = table[s][s] - table[s][s - 1]
            assert got[s] == pytest.approx(expected, rel=0, abs=BOUND), s
        else:
            assert got[s] is None, s


def test_realized_and_drift_add_up_to_the_sampled_change():
    table = entropy_table(7)
    got = feed(table, set(range(STEPS)))
    for s in range(1, STEPS):
        realized = table[s][s - 1] - table[s - 1][s - 1]
        change = table[s][s] - table[s - 1][s - 1]
        assert realized + got[s] == pytest.approx(change, rel=0, abs=BOUND)


def test_a_non_finite_step_breaks_the_chain_on_both_sides():
    """Step 4's entropy is NaN (non-finite logits): no drift at 4 (nothing to compare) nor at 5
    (step 4 measured no realized change); the chain resumes after the next measured step."""
    table = entropy_table(3)
    got = feed(table, set(range(STEPS)), nonfinite={4})
    assert got[4] is None and got[5] is None
    assert got[6] == pytest.approx(table[6][6] - table[6][5], rel=0, abs=BOUND)


def test_state_survives_a_checkpoint():
    """A tracker restored from another's state dict continues its sequence exactly."""
    table = entropy_table(11)
    straight = EntropyDrift()
    for s in range(6):
        straight.step(table[s][s], table[s + 1][s] - table[s][s])
    resumed = EntropyDrift()
    resumed.load_state_dict(straight.state_dict())
    assert resumed.step(table[6][6], None) == straight.step(table[6][6], None)
    assert resumed.step(table[7][7], None) is None
