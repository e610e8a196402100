"""The update of one rollout batch, for every engine: the two-phase step of docs/architecture.md,
and the order of a corrected update (docs/core.md, "The entropy-neutral update")."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from opefo_nemo.config.engines import BALANCED
from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.entropy_flow import ESTIMATOR_SUMS
from opefo_nemo.core.fidelity import DEFAULT_THRESHOLD, fidelity_metrics, fidelity_sums
from opefo_nemo.core.metrics import add_sums
from opefo_nemo.core.objectives import (
    Coefficients,
    LossOutput,
    Objective,
    TokenChunk,
    loss_sum_names,
    policy_loss,
    prepare,
    step_loss_metrics,
)
from opefo_nemo.core.reweighting import DEFAULT_CONFIDENT_PROB
from opefo_nemo.core.update_correction import CorrectionResult, correction_size
from opefo_nemo.engines.batch import TrainBatch, to_device
from opefo_nemo.engines.protocols import (
    EngineStepResult,
    EntropyGradient,
    LossFn,
    Policy,
    SharedForwardPolicy,
)
from opefo_nemo.parallel import TokenStats
from opefo_nemo.trainer.seeds import mini_batch_seed
from opefo_nemo.trainer.stats_pass import kept_forward, stats_pass
from opefo_nemo.trainer.update_layout import layout_metrics, plan_update, row_lengths


@dataclass(frozen=True)
class RolloutUpdateSummary:
    """What the trainer makes of the update of one rollout batch (:func:`update_rollout_batch`):
    the metrics of its optimizer steps (averaged over them) and how many were skipped (NaN).

    ``entropy_before``: token-mean entropy of the whole rollout batch under the policy that
    generated it (the first stats pass); ``flow/realized`` compares it with a pass after the update.
    ``corrections``: the correction of each corrected optimizer step, in order (empty for a
    method that does not correct its update).
    """

    metrics: dict[str, float]
    skipped_steps: int
    entropy_before: float
    corrections: tuple[CorrectionResult, ...] = ()


def predicted_change(outcome: RolloutUpdateSummary) -> float | None:
    """The entropy change an update predicts (spec §6 ``flow/predictor_corr``): the net flow
    after weighting, or for corrected updates their exact first order ``⟨g, Δθ'⟩`` (summed over
    the steps); ``None`` when it is zero by construction (adaptive OPEFO's; corrections to a
    target of 0, up to the fp32 weights' rounding), which predicts nothing."""
    if outcome.corrections:
        if all(c.target == 0 for c in outcome.corrections):
            return None
        return sum(c.flow_after for c in outcome.corrections)
    predicted = outcome.metrics["flow/net_after_balance"]
    flows = outcome.metrics["flow/pos"] + outcome.metrics["flow/neg"]
    return predicted if abs(predicted) > 1e-6 * flows else None


@dataclass(frozen=True)
class OptimizerStepSummary:
    """What the trainer makes of one optimizer step (:func:`optimizer_step`): its spec §6
    metrics, from phase 2 and the engine's :class:`EngineStepResult`, whether the engine skipped
    it (a non-finite loss or gradient) and its correction (``None``: not corrected, or
    skipped)."""

    metrics: dict[str, float]
    skipped: bool
    correction: CorrectionResult | None = None


@dataclass(frozen=True)
class EntropyCorrectionRequest:
    """The request that :func:`engine_step` correct the update it applies, with what that needs:
    ``entropy_fn(i, stats_with_grad)``, micro-batch ``i``'s share ``Σ mask·H_t / N`` of the
    batch's token-mean entropy ``H̄``, and ``target``, the first-order change ``⟨∇θ H̄, Δθ'⟩`` the
    step must have (``Objective.update_target``); what was done: :class:`CorrectionResult`."""

    entropy_fn: LossFn
    target: float


def mean_entropy(micro_batches: Sequence[TrainBatch], stats: Sequence[TokenStats]) -> float:
    """Token mean of ``H_t`` over the response tokens of all micro-batches."""
    total = sum(
        float((s.entropy.double() * m.response_mask).sum())
        for m, s in zip(micro_batches, stats, strict=True)
    )
    count = sum(m.n_response_tokens for m in micro_batches)
    return total / count


def _on_device(
    device: torch.device, micro: TrainBatch, coefficients: Coefficients, old: Tensor | None
) -> tuple[Tensor, Tensor, Coefficients, Tensor | None]:
    """What the loss of one micro-batch reads besides the statistics, on the policy's device
    (one copy per step, before the engine's schedule runs; pinned and non-blocking on a GPU)."""

    def move(tensor: Tensor) -> Tensor:
        return to_device(tensor, device)

    fields = dataclasses.fields(coefficients)
    moved = Coefficients(*(move(getattr(coefficients, f.name)) for f in fields))
    return (
        move(micro.advantages),
        move(micro.response_mask),
        moved,
        None if old is None else move(old),
    )


def token_chunks(
    micro_batches: Sequence[TrainBatch],
    stats: Sequence[TokenStats],
    old_logprob: Sequence[Tensor] | None = None,
    old_entropy: Sequence[Tensor] | None = None,
) -> list[TokenChunk]:
    """What phase 2 (``prepare``) reads of each micro-batch: its phase-1 ``stats`` with the
    batch's advantages, mask, token ids and rollout logprobs (and, for a later mini-batch, the
    rollout policy's logprobs and entropies)."""
    return [
        TokenChunk(
            logprob=s.logprob,
            entropy=s.entropy,
            advantages=m.advantages,
            mask=m.response_mask,
            old_logprob=None if old_logprob is None else old_logprob[i],
            token_ids=m.token_ids,
            sum_p2=s.sum_p2,
            sum_p2_logp=s.sum_p2_logp,
            sum_p3=s.sum_p3,
            sum_p3_logp=s.sum_p3_logp,
            rollout_logprob=m.rollout_logprob,
            old_entropy=None if old_entropy is None else old_entropy[i],
        )
        for i, (m, s) in enumerate(zip(micro_batches, stats, strict=True))
    ]


def optimizer_step(
    policy: Policy,
    objective: Objective,
    micro_batches: Sequence[TrainBatch],
    stats: Sequence[TokenStats],
    old_logprob: Sequence[Tensor] | None,
    seed: int,
    confident_prob: float = DEFAULT_CONFIDENT_PROB,
    old_entropy: Sequence[Tensor] | None = None,
    kept: Sequence[TokenStats] | None = None,
    owners: Sequence[int] | None = None,
) -> OptimizerStepSummary:
    """Phases 2 and 3 for one optimizer-step batch given its phase-1 ``stats``
    (``confident_prob``: ``metrics.confident_prob``, spec §6; ``old_entropy``: the rollout
    policy's entropies of a later mini-batch; ``kept``: the same statistics with their graphs,
    ``SharedForwardPolicy.forward_with_graph``; ``owners``: the data-parallel rank of each
    micro-batch, ``MicroBatchLayout.owners``): its metrics are spec §6 flow, loss, clip,
    ``grad/norm``, ``lr``, and ``correction/*`` for a method that corrects its update
    (``Objective.update_target`` not ``None``: :func:`engine_step`)."""
    chunks = token_chunks(micro_batches, stats, old_logprob, old_entropy)
    prepared = prepare(
        objective, chunks, SingleProcessReducer(), seed=seed, confident_prob=confident_prob
    )
    inputs = [
        _on_device(policy.device, m, c, None if old_logprob is None else old_logprob[i])
        for i, (m, c) in enumerate(zip(micro_batches, prepared.coefficients, strict=True))
    ]

    def loss_fn(index: int, with_grad: TokenStats) -> LossOutput:
        advantages, mask, coefficients, old = inputs[index]
        return policy_loss(
            objective,
            with_grad.logprob,
            advantages,
            mask,
            coefficients,
            prepared.n_tokens,
            old_logprob=old,
            entropy=with_grad.entropy if objective.differentiates_entropy else None,
        )

    request = None
    if prepared.update_target is not None:

        def entropy_fn(index: int, with_grad: TokenStats) -> LossOutput:
            mask = inputs[index][1]
            return LossOutput((with_grad.entropy * mask).sum() / prepared.n_tokens, {})

        request = EntropyCorrectionRequest(entropy_fn, prepared.update_target)
    names = loss_sum_names(objective)
    result, corrected = engine_step(policy, micro_batches, loss_fn, names, request, kept, owners)
    metrics = dict(prepared.metrics)
    if not result.skipped:
        metrics.update(step_loss_metrics(objective, result.sums, prepared.n_tokens))
    if corrected is not None:
        metrics.update(corrected.metrics())
    metrics.update({"grad/norm": result.grad_norm, "lr": result.lr})
    return OptimizerStepSummary(metrics, result.skipped, corrected)


def engine_step(
    policy: Policy,
    micro_batches: Sequence[TrainBatch],
    loss_fn: LossFn,
    sum_names: Sequence[str],
    request: EntropyCorrectionRequest | None,
    kept: Sequence[TokenStats] | None = None,
    owners: Sequence[int] | None = None,
) -> tuple[EngineStepResult, CorrectionResult | None]:
    """One optimizer step of ``policy``; with a correction ``request``, in this order for every
    engine:

    1. ``g = ∇θ H̄`` captured at the weights before the step (``Policy.capture_entropy_gradient``:
       one more forward and backward of the batch); a non-finite ``g`` skips the step;
    2. the policy-gradient step (``Policy.train_step``);
    3. the applied update corrected along ``g`` (:func:`correct_update`), unless step 2 skipped.

    With ``kept`` (a :class:`SharedForwardPolicy`'s statistics with their graphs), steps 1 and 2
    are backward passes through those graphs. ``owners``: the data-parallel rank that runs each
    micro-batch in both.
    """
    if kept is None:
        capture = functools.partial(policy.capture_entropy_gradient, owners=owners)
        step = functools.partial(policy.train_step, owners=owners)
    elif isinstance(policy, SharedForwardPolicy):
        capture = functools.partial(policy.capture_entropy_gradient, owners=owners, kept=kept)
        step = functools.partial(policy.train_step, owners=owners, kept=kept)
    else:
        raise TypeError(f"{type(policy).__name__} cannot reuse a kept forward")
    if request is None:
        return step(micro_batches, loss_fn, sum_names), None
    gradient = capture(micro_batches, request.entropy_fn)
    if gradient is None:
        return EngineStepResult(grad_norm=math.nan, lr=policy.lr, skipped=True), None
    result = step(micro_batches, loss_fn, sum_names)
    if result.skipped:
        return result, None
    return result, correct_update(gradient, request.target)


def correct_update(gradient: EntropyGradient, target: float) -> CorrectionResult:
    """``Δθ' = Δθ + α g`` with ``α`` such that ``⟨g, Δθ'⟩ = target``
    (:func:`~opefo_nemo.core.update_correction.correction_size`), ``Δθ`` the update applied since
    ``g`` was captured; then ``⟨g, Δθ'⟩`` measured on the weights the optimizer keeps (the target
    up to their rounding). Two all-reduces of two float64 numbers, nothing gathered."""
    grad_sq, flow = gradient.inner_products()
    alpha = correction_size(target, flow, grad_sq)
    gradient.move(alpha)
    _, flow_after = gradient.inner_products()
    return CorrectionResult(
        target=target,
        flow_before=flow,
        flow_after=flow_after,
        alpha=alpha,
        grad_norm=math.sqrt(grad_sq),
    )


def rollout_fidelity(
    micro_batches: Sequence[TrainBatch], stats: Sequence[TokenStats], threshold: float
) -> dict[str, float]:
    """``fidelity/*`` (:mod:`opefo_nemo.core.fidelity`) of the trainer's logprobs under the
    rollout's weights against the rollout engine's; empty when the batch carries none."""
    if any(m.rollout_logprob is None for m in micro_batches):
        return {}
    sums: dict[str, Tensor] = {}
    for micro, s in zip(micro_batches, stats, strict=True):
        assert micro.rollout_logprob is not None  # checked above
        part = fidelity_sums(s.logprob, micro.rollout_logprob, micro.response_mask, threshold)
        sums = add_sums(sums, part)
    return fidelity_metrics(sums)


def update_rollout_batch(
    policy: Policy,
    objective: Objective,
    batch: TrainBatch,
    micro_batch_size: int,
    seed: int,
    *,
    batch_layout: str = BALANCED,
    max_tokens_per_micro_batch: int | None = None,
    attention_width: int | None = None,
    fidelity_threshold: float = DEFAULT_THRESHOLD,
    confident_prob: float = DEFAULT_CONFIDENT_PROB,
) -> RolloutUpdateSummary:
    """All optimizer steps of one rollout batch; its metrics include :func:`rollout_fidelity`
    when the batch carries the rollout engine's logprobs, and :func:`layout_metrics`.

    The micro-batches of each mini-batch and the rank that runs each are
    :func:`plan_update`'s (``engine.micro_batch_size``, ``engine.batch_layout``,
    ``engine.max_tokens_per_micro_batch``, the model's ``attention_width``); which rows share
    one changes nothing beyond rounding (spec §11).

    Strict on-policy (``updates_per_rollout == 1``): one stats pass, one ``prepare`` over every
    micro-batch (global λ*, token count), one optimizer step; ρ ≡ 1. Approximate
    (``updates_per_rollout = k``): k consecutive mini-batches, each with a fresh stats pass (the
    first reuses the rollout batch's, which gives ``old_logprob``), its own ``prepare`` and step;
    metrics averaged over the steps (docs/training.md, "The loop")."""
    method = objective.config
    sums = ESTIMATOR_SUMS[method.entropy_flow.estimator]
    k = method.updates_per_rollout
    if batch.rows % k:
        raise ValueError(f"{batch.rows} responses cannot be cut into {k} equal mini-batches")
    layouts = plan_update(
        policy,
        batch,
        k,
        micro_batch_size,
        batch_layout,
        max_tokens_per_micro_batch,
        attention_width,
    )
    micros = [[batch.select(rows) for rows in layout.rows] for layout in layouts]
    kept = kept_forward(policy, micros[0], sums) if k == 1 else None
    if kept is None:
        first = stats_pass(policy, batch, layouts, micros, sums)
    else:
        first = [[s.map(lambda t: t.detach().cpu()) for s in kept]]
    all_micros, all_first = [m for ms in micros for m in ms], [s for ss in first for s in ss]
    entropy_before = mean_entropy(all_micros, all_first)
    whole = rollout_fidelity(all_micros, all_first, fidelity_threshold)  # of the whole batch
    lengths = row_lengths(batch)
    whole.update(layout_metrics(layouts, lengths, policy.sequence_multiple, attention_width))
    if k == 1:
        step = optimizer_step(
            policy,
            objective,
            micros[0],
            first[0],
            None,
            seed,
            confident_prob,
            kept=kept,
            owners=layouts[0].owners,
        )
        corrected = () if step.correction is None else (step.correction,)
        return RolloutUpdateSummary(
            {**step.metrics, **whole}, int(step.skipped), entropy_before, corrected
        )

    size = batch.rows // k
    steps: list[OptimizerStepSummary] = []
    for j, (layout, mini_micros) in enumerate(zip(layouts, micros, strict=True)):
        if j == 0:
            stats = first[0]
        else:
            mini = batch.select(range(j * size, (j + 1) * size))
            (stats,) = stats_pass(policy, mini, [layout.shifted(-j * size)], [mini_micros], sums)
        steps.append(
            optimizer_step(
                policy,
                objective,
                mini_micros,
                stats,
                [s.logprob for s in first[j]],
                mini_batch_seed(seed, k, j),
                confident_prob,
                old_entropy=[s.entropy for s in first[j]],
                owners=layout.owners,
            )
        )
    per_step = [step.metrics for step in steps]
    averaged = {
        name: sum(m[name] for m in per_step if name in m) / sum(name in m for m in per_step)
        for name in {key for m in per_step for key in m}
    }
    averaged["entropy/mean"] = entropy_before
    skipped_steps = sum(step.skipped for step in steps)
    corrections = tuple(step.correction for step in steps if step.correction is not None)
    return RolloutUpdateSummary({**averaged, **whole}, skipped_steps, entropy_before, corrections)


@torch.no_grad()
def realized_entropy_change(policy: Policy, batch: TrainBatch, entropy_before: float) -> float:
    """``flow/realized``: token-mean entropy of ``batch`` now minus ``entropy_before`` (spec §6),
    from one statistics pass in the engine's own forward-only layout."""
    stats = policy.token_stats(batch)
    total = float((stats.entropy.double() * batch.response_mask).sum())
    return total / batch.n_response_tokens - entropy_before
