"""The two-phase update on the hf engine, against brute-force references (no vLLM needed)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from opefo_nemo.config import load_method
from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core.objectives import LossOutput, build_objective, registry
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.parallel import VOCAB_SUMS, NonFiniteLogitsError
from opefo_nemo.trainer.nan_guard import NanGuard, NanStreakError
from opefo_nemo.trainer.stats_pass import stats_pass
from opefo_nemo.trainer.update import update_rollout_batch
from opefo_nemo.trainer.update_layout import plan_update
from tests.docs_blocks import docs_block
from tests.metric_bounds import assert_grads_close
from tests.trainer.update_inputs import ENGINE, GRAD_REL, TEMPERATURE, random_rollout


def test_build_batch_marks_exactly_the_response_targets():
    prompts, responses, adv = random_rollout()
    batch = build_batch(prompts, responses, adv, pad_id=0)
    for row, r in enumerate(responses):
        assert batch.targets[row][batch.response_mask[row]].tolist() == r
        assert torch.all(batch.advantages[row][batch.response_mask[row]] == adv[row])
    sub = batch.select([1, 3])
    assert sub.targets[0][sub.response_mask[0]].tolist() == responses[1]


def captured_gradient(model_dir, method_name, micro_batch_size, shared_forward=False):
    """Gradient accumulated by one strict optimizer step, captured before the optimizer runs,
    and the step's metrics; ``shared_forward``: the statistics pass's graphs reused by the loss."""
    method = load_method(method_name)
    engine = dataclasses.replace(ENGINE, shared_forward=shared_forward)
    policy = HFPolicy(model_dir, engine, lr=method.lr, temperature=TEMPERATURE)
    grads = {}
    for name, param in policy.model.named_parameters():
        param.register_post_accumulate_grad_hook(
            lambda p, name=name: grads.__setitem__(name, p.grad.detach().clone())
        )
    forwards = []
    policy.model.register_forward_hook(lambda *_: forwards.append(torch.is_grad_enabled()))
    batch = build_batch(*random_rollout(), pad_id=0)
    outcome = update_rollout_batch(policy, build_objective(method), batch, micro_batch_size, 0)
    assert outcome.skipped_steps == 0 and not outcome.corrections
    micros = len(batch.split(micro_batch_size))
    # the statistics pass (a forward per micro-batch, no graph), then the loss's forwards;
    # shared: the loss reuses the statistics forwards' graphs
    want = [True] * micros if shared_forward else [False] * micros + [True] * micros
    assert forwards == want
    return grads, outcome.metrics


def reference_gradient(model_dir, method_name):
    """``∇ −Σ w_t A_t log π(y_t) / N`` from an unpadded per-row forward and spec §2–§3 by hand."""
    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    prompts, responses, adv = random_rollout()
    logps, dhs, advs = [], [], []
    for p, r, a in zip(prompts, responses, adv, strict=True):
        ids = torch.tensor([p + r])
        logits = policy.model(input_ids=ids).logits[0, len(p) - 1 : -1].double() / TEMPERATURE
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(1, torch.tensor(r)[:, None])[:, 0]
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        prob = logp.detach().exp()
        dhs.append(-a.double() * (1 - prob) ** 2 * (logp.detach() + entropy.detach()))
        logps.append(logp)
        advs.append(torch.full_like(logp, float(a)))
    logp, dh, a = torch.cat(logps), torch.cat(dhs), torch.cat(advs)
    weight = torch.ones_like(dh)
    if method_name == "opefo":
        pos, neg = dh[dh > 0].sum(), -dh[dh < 0].sum()
        lam = (neg - pos) / (neg + pos)
        weight = torch.where(dh > 0, 1 + lam, torch.where(dh < 0, 1 - lam, weight))
    loss = -(weight * a * logp).sum() / logp.numel()
    loss.backward()
    return {name: p.grad.clone() for name, p in policy.model.named_parameters()}


@pytest.mark.parametrize("shared_forward", [False, True])
@pytest.mark.parametrize("method_name", ["grpo_strict", "opefo"])
def test_strict_gradient_is_the_full_batch_gradient_for_any_micro_batch(
    model_dir, method_name, shared_forward
):
    reference = reference_gradient(model_dir, method_name)
    lambdas = []
    for micro in (6, 4, 1):
        grads, metrics = captured_gradient(model_dir, method_name, micro, shared_forward)
        lambdas.append(metrics["flow/lambda"])
        assert_grads_close(grads, reference, rel=GRAD_REL)
    assert max(lambdas) - min(lambdas) <= GRAD_REL  # λ* has scale 1 (tests/metric_bounds.py)


@pytest.mark.parametrize("shared_forward", [False, True])
def test_bfloat16_policy_trains_with_fp32_statistics(model_dir, shared_forward):
    method = load_method("opefo")
    engine = EngineConfig(dtype="bfloat16", warmup_steps=0, shared_forward=shared_forward)
    policy = HFPolicy(model_dir, engine, lr=1e-3, temperature=1.0)
    assert next(policy.model.parameters()).dtype == torch.bfloat16
    prompts, responses, adv = random_rollout()
    outcome = update_rollout_batch(
        policy, build_objective(method), build_batch(prompts, responses, adv, 0), 4, 0
    )
    assert outcome.skipped_steps == 0 and math.isfinite(outcome.metrics["grad/norm"])
    micro = build_batch(prompts, responses, adv, 0)
    assert policy.token_stats(micro).logprob.dtype == torch.float32


def test_non_finite_loss_skips_the_step_and_keeps_the_weights(model_dir):
    method = load_method("grpo_strict")
    policy = HFPolicy(model_dir, ENGINE, lr=1e-2, temperature=1.0)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    prompts, responses, adv = random_rollout()
    micros = build_batch(prompts, responses, adv, pad_id=0).split(3)
    result = policy.train_step(
        micros, lambda i, stats: LossOutput(stats.logprob.sum() * float("nan"), {}), ()
    )
    assert result.skipped and math.isnan(result.grad_norm)
    for name, param in policy.model.named_parameters():
        assert torch.equal(param.detach(), before[name]), name
    assert not policy.train_step(
        micros, lambda i, stats: LossOutput(-stats.logprob.sum(), {}), ()
    ).skipped
    changed = any(
        not torch.equal(p.detach(), before[n]) for n, p in policy.model.named_parameters()
    )
    assert changed, "a finite step must move the weights"
    assert method.strict_on_policy


@pytest.mark.parametrize("shared_forward", [False, True])
def test_nan_weights_raise_in_the_token_stats_pass(model_dir, shared_forward):
    method = load_method("opefo")
    engine = dataclasses.replace(ENGINE, shared_forward=shared_forward)
    policy = HFPolicy(model_dir, engine, lr=1e-3, temperature=1.0)
    with torch.no_grad():
        next(policy.model.parameters()).fill_(float("nan"))
    prompts, responses, adv = random_rollout()
    with pytest.raises(NonFiniteLogitsError):
        update_rollout_batch(
            policy, build_objective(method), build_batch(prompts, responses, adv, 0), 2, seed=0
        )


def test_nan_guard_aborts_after_the_configured_streak():
    guard = NanGuard(limit=2)
    guard.record(0, skipped=1)
    guard.record(1, skipped=0)
    guard.record(2, skipped=1)
    with pytest.raises(NanStreakError, match="max_nan_steps=2"):
        guard.record(3, skipped=8)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_warmup_schedule_is_linear_over_rollout_steps(model_dir):
    engine = EngineConfig(warmup_steps=4)
    policy = HFPolicy(model_dir, engine, lr=1e-3, temperature=1.0)
    seen = []
    for _ in range(6):
        seen.append(policy.lr)
        policy.advance_schedule()
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


@pytest.mark.parametrize("micro_batch_size", [1, 4])
def test_stats_pass_is_one_call_returned_like_the_layouts(model_dir, micro_batch_size):
    """Reference: the engine's own stats of each micro-batch, one call each (the old pass), at
    every response token (prompt and padding positions are masked everywhere downstream); the
    pass's micro-batches are two mini-batches' balanced layouts with a token budget (rows not
    consecutive), the reference's forwards ``engine.micro_batch_size`` rows."""
    engine = dataclasses.replace(ENGINE, micro_batch_size=micro_batch_size)
    policy = HFPolicy(model_dir, engine, lr=1e-3, temperature=TEMPERATURE)
    batch = build_batch(*random_rollout(), pad_id=0)
    layouts = plan_update(policy, batch, 2, 2, max_tokens_per_micro_batch=20)
    assert (0, 2) in layouts[0].rows  # rows 1 and 0, 2 by length
    pieces = [[batch.select(rows) for rows in layout.rows] for layout in layouts]
    got = stats_pass(policy, batch, layouts, pieces, VOCAB_SUMS)
    assert [len(stats) for stats in got] == [len(micros) for micros in pieces]
    for stats, micro in zip(itertools.chain(*got), itertools.chain(*pieces), strict=True):
        want = policy.token_stats(micro, sums=VOCAB_SUMS)
        real = micro.response_mask
        for field in ("logprob", "entropy", *VOCAB_SUMS):
            torch.testing.assert_close(getattr(stats, field)[real], getattr(want, field)[real])
    with pytest.raises(ValueError, match="do not cover the batch's 6 rows"):
        stats_pass(policy, batch, layouts[:1], pieces[:1], ())


def test_a_later_mini_batch_reads_the_rollout_policys_logprobs_and_entropies(model_dir):
    """Approximate on-policy: mini-batch 1's ``prepare`` sees the rollout policy's logprobs and
    entropies (what STEER's weights read) beside the moved policy's own, taken before any update.
    """
    from opefo_nemo.core.objectives.methods.steer import Steer

    seen = []

    class Recording(Steer):
        def coefficients(self, batch, reducer, seed):
            seen.append(list(batch.chunks))
            return super().coefficients(batch, reducer, seed)

    policy = HFPolicy(model_dir, ENGINE, lr=1e-2, temperature=TEMPERATURE)
    batch = build_batch(*random_rollout(), pad_id=0)
    before = policy.token_stats(batch)
    method = load_method("steer", ["updates_per_rollout=2"])
    outcome = update_rollout_batch(policy, Recording(method), batch, 3, 0)
    assert outcome.skipped_steps == 0 and len(seen) == 2
    (later,) = seen[1]
    mask = later.mask
    rows, width = mask.shape
    assert later.old_entropy is not None and later.old_logprob is not None
    for old, full in ((later.old_entropy, before.entropy), (later.old_logprob, before.logprob)):
        torch.testing.assert_close(old[mask], full[3 : 3 + rows, :width][mask])
    # the weights moved between the two steps: the current entropy is not the rollout's
    assert not torch.allclose(later.entropy[mask], later.old_entropy[mask])


def test_the_documented_update_method_is_corrected_without_engine_code(
    model_dir, monkeypatch, tmp_path
):
    """docs/core.md's ``fixed_change`` (a module and a YAML, nothing in the engines): one update
    on the ``hf`` engine reports one correction whose target is the configured change, and the
    corrected update's exact first order ``⟨g, Δθ'⟩`` is that change up to the fp32 rounding of
    the corrected weights (``‖g‖ ε₃₂ ‖θ‖``)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    exec(compile(docs_block("python", "# my_update_method.py"), "my_update_method.py", "exec"), {})
    yaml = tmp_path / "fixed_change.yaml"
    yaml.write_text(docs_block("yaml", "# conf/method/fixed_change.yaml"))
    change = 2e-3
    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    objective = build_objective(load_method(yaml, [f"change={change}"]))
    prompts, responses, adv = random_rollout()
    outcome = update_rollout_batch(policy, objective, build_batch(prompts, responses, adv, 0), 3, 0)
    assert outcome.skipped_steps == 0 and len(outcome.corrections) == 1
    correction = outcome.corrections[0]
    assert correction.target == change
    assert correction.flow_before != pytest.approx(change, rel=0.1)  # the optimizer's own differs
    norm = math.sqrt(sum(float(w.double().square().sum()) for _, w in policy.named_weights()))
    eps = torch.finfo(torch.float32).eps
    assert abs(correction.flow_after - change) <= correction.grad_norm * eps * norm
    assert outcome.metrics["correction/flow_after"] == correction.flow_after
