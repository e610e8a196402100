"""One rollout step's entropy-flow statistics without training: what ``opefo-probe`` reports,
computed by ``opefo-train``'s own step-1 path up to the optimizer, with no probe-specific math
(docs/training.md, "Which regime is my run in?").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.advantages import group_signal
from opefo_nemo.core.entropy_flow import ESTIMATOR_SUMS, ESTIMATORS
from opefo_nemo.core.objectives import build_objective, prepare
from opefo_nemo.probe.group_flows import GroupFlow, group_flows
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.stats_pass import stats_pass
from opefo_nemo.trainer.update import rollout_fidelity, token_chunks
from opefo_nemo.trainer.update_layout import layout_metrics, plan_update, row_lengths

#: The vocabulary sums of every estimator, in the order ``token_stats`` names them.
ALL_SUMS = tuple(dict.fromkeys(name for sums in ESTIMATOR_SUMS.values() for name in sums))


@dataclass(frozen=True)
class ProbeResult:
    """``rollout``: the batch's rollout, fidelity and layout (``perf/*``, as the update would lay
    it out) metrics (shared by every estimator);
    ``estimators``: ``prepare``'s metrics for each ΔH estimator; ``configured``: the estimator of
    the configured method; ``groups``: each estimator's flows of each group (prompt);
    ``prompts`` × ``responses``: the batch; ``signal``: per group, in the order of ``groups``,
    whether its rewards differ, i.e. whether dynamic sampling keeps it (with
    ``trainer.dynamic_sampling`` the batch is already the kept groups, and ``rollout`` holds
    ``sampling/*``)."""

    prompts: int
    responses: int
    configured: str
    rollout: dict[str, float]
    estimators: dict[str, dict[str, float]]
    groups: dict[str, list[GroupFlow]]
    signal: tuple[bool, ...] = ()


class NothingToProbeError(RuntimeError):
    """Dynamic sampling kept no group: no batch to compute statistics of."""


def probe(trainer: Trainer, stage: Callable[[str], None] = lambda _: None) -> ProbeResult:
    """Generate and score one rollout batch with ``trainer``, then report its statistics, and
    each group's flows, under every ΔH estimator; ``stage(name)`` is called as each stage begins
    (a progress bar)."""
    config = trainer.config
    stage(f"generating {config.trainer.prompts_per_step} × {config.trainer.responses_per_prompt}")
    collected = trainer.collect()
    if collected.batch is None:
        rounds = int(collected.metrics["sampling/rounds"])
        raise NothingToProbeError(
            f"no group's rewards differed in {rounds} round(s) of "
            f"{config.trainer.prompts_per_step} prompts (trainer.dynamic_sampling): there is no "
            "batch to probe; raise trainer.dynamic_sampling_max_rounds or turn dynamic sampling off"
        )
    trainer.rollout.sleep()  # its GPU memory goes to the token-stats pass (no-op on CPU)
    stage("token statistics")
    batch, engine = collected.batch, config.engine
    layouts = plan_update(
        trainer.policy,
        batch,
        config.method.updates_per_rollout,
        engine.micro_batch_size,
        engine.batch_layout,
        engine.max_tokens_per_micro_batch,
        trainer.attention_width,
    )
    pieces = [[batch.select(rows) for rows in layout.rows] for layout in layouts]
    per_layout = stats_pass(trainer.policy, batch, layouts, pieces, ALL_SUMS)
    micros = [m for ms in pieces for m in ms]
    stats = [s for ss in per_layout for s in ss]
    order = torch.tensor([row for layout in layouts for row in layout.flat_rows])  # of the chunks
    rollout = dict(collected.metrics)
    rollout.update(rollout_fidelity(micros, stats, config.metrics.fidelity_threshold))
    multiple, attention = trainer.policy.sequence_multiple, trainer.attention_width
    rollout.update(layout_metrics(layouts, row_lengths(batch), multiple, attention))
    chunks = token_chunks(micros, stats)
    per_estimator, per_group = {}, {}
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
        per_group[estimator] = group_flows(
            chunks, prepared, collected.group_ids[order], collected.correct[order]
        )
    return ProbeResult(
        prompts=config.trainer.prompts_per_step,
        responses=config.trainer.responses_per_prompt,
        configured=config.method.entropy_flow.estimator,
        rollout=rollout,
        estimators=per_estimator,
        groups=per_group,
        signal=tuple(group_signal(collected.rewards, collected.group_ids).tolist()),
    )
