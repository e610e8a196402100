"""One rollout step's entropy-flow statistics without training: what ``opefo-probe`` reports.

The path is step 1 of ``opefo-train`` up to the optimizer: the trainer's own rollout and scoring
(:meth:`.loop.Trainer.collect`), one token-stats pass over the whole batch with the vocabulary
sums of every ΔH estimator, and ``prepare`` (phase 2) once per estimator on the same statistics.
So each estimator's figures are those ``opefo-train`` would log at its first step with that
estimator, and every metric ``prepare`` returns is reported, without probe-specific math.
Nothing is trained, saved or logged.

For a method with several updates per rollout, ``prepare`` here covers the whole rollout batch
under the rollout's weights, while the trainer's figures average its mini-batches, the later ones
under updated weights; for strict on-policy methods (OPEFO's setting) the two are the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..core import SingleProcessReducer
from ..core.entropy_flow import ESTIMATOR_SUMS, ESTIMATORS
from ..core.objectives import build_objective, prepare
from .loop import Trainer
from .update import rollout_fidelity, stats_pass, token_chunks

#: The vocabulary sums of every estimator, in the order ``token_stats`` names them.
ALL_SUMS = tuple(dict.fromkeys(name for sums in ESTIMATOR_SUMS.values() for name in sums))


@dataclass(frozen=True)
class ProbeResult:
    """``rollout``: the batch's rollout and fidelity metrics (shared by every estimator);
    ``estimators``: ``prepare``'s metrics for each ΔH estimator; ``configured``: the estimator of
    the configured method; ``prompts`` × ``responses``: the batch."""

    prompts: int
    responses: int
    configured: str
    rollout: dict[str, float]
    estimators: dict[str, dict[str, float]]


def probe(trainer: Trainer, stage: Callable[[str], None] = lambda _: None) -> ProbeResult:
    """Generate and score one rollout batch with ``trainer``, then report its statistics under
    every ΔH estimator; ``stage(name)`` is called as each stage begins (a progress bar)."""
    config = trainer.config
    stage(f"generating {config.trainer.prompts_per_step} × {config.trainer.responses_per_prompt}")
    collected = trainer.collect()
    trainer.rollout.sleep()  # its GPU memory goes to the token-stats pass (no-op on CPU)
    stage("token statistics")
    micros = collected.batch.split(config.engine.micro_batch_size)
    stats = stats_pass(trainer.policy, collected.batch, micros, ALL_SUMS)
    rollout = dict(collected.metrics)
    rollout.update(rollout_fidelity(micros, stats, config.metrics.fidelity_threshold))
    chunks = token_chunks(micros, stats)
    per_estimator = {}
    for estimator in ESTIMATORS:
        stage(f"prepare ({estimator})")
        flow = dataclasses.replace(config.method.entropy_flow, estimator=estimator)
        method = dataclasses.replace(config.method, entropy_flow=flow)
        prepared = prepare(
            build_objective(method),
            chunks,
            SingleProcessReducer(),
            seed=trainer.update_seed(),
            confident_prob=config.metrics.confident_prob,
        )
        per_estimator[estimator] = dict(prepared.metrics)
    return ProbeResult(
        prompts=config.trainer.prompts_per_step,
        responses=config.trainer.responses_per_prompt,
        configured=config.method.entropy_flow.estimator,
        rollout=rollout,
        estimators=per_estimator,
    )
