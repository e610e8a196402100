"""The seeds a run derives from ``run.seed``: each a function of the step (and round or
mini-batch) alone, so a resumed run draws what the uninterrupted one would have, and no two
draws of a run share one."""

from __future__ import annotations

from opefo_nemo.config.run import SEEDS_PER_STEP

STEPS_PER_RUN_SEED = 1_000_003
"""Steps one run seed spans: :func:`step_seed` is distinct for every ``(run seed, step)`` with
``0 <= step < STEPS_PER_RUN_SEED``, so runs of neighbouring seeds never share a step's seed."""


def step_seed(run_seed: int, step: int) -> int:
    """The seed of step ``step`` of the run seeded ``run_seed``: seeds the step's update (a
    method's randomness: Clip-Cov's subset) and, scaled by :func:`sampling_seed`, its rollout."""
    return run_seed * STEPS_PER_RUN_SEED + step


def sampling_seed(run_seed: int, step: int, first_response: int) -> int:
    """The rollout seed of step ``step`` from its response ``first_response`` on (the servers
    add each response's index, ``SamplingConfig``): every step owns the ``SEEDS_PER_STEP`` seeds
    from ``step_seed × SEEDS_PER_STEP``, distinct while ``first_response`` plus the responses
    drawn stays within them (``TrainerConfig.validate`` bounds the dynamic sampling rounds)."""
    return step_seed(run_seed, step) * SEEDS_PER_STEP + first_response


def mini_batch_seed(update_seed: int, updates: int, index: int) -> int:
    """The seed of mini-batch ``index`` of the ``updates`` a step's rollout is cut into: distinct
    for every ``(update_seed, index)`` with ``0 <= index < updates``."""
    return update_seed * updates + index
