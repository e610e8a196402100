"""``rollout=engine``: the hf engine's model samples (``engines/hf_generation.py``), checked
against the trainer's own token statistics, brute-force sampling frequencies and the vLLM path's
stop and seed contract (docs/rollout.md)."""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.config.compose import compose
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.engines.hf_generation import HFGenerator
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer
from tests.engines.generation_reference import (
    STOP,
    logprob_bound,
    ragged_prompts,
    sampling,
)
from tests.trainer.small_run import run_overrides
from tests.trainer.update_inputs import ENGINE, TEMPERATURE, tiny_model

#: Two-sided normal quantile per token count: P(|Z| > 5) = 5.7e-7, so over the ≤ 77 tokens of
#: the tiny vocabulary a correct sampler fails a frequency check with probability < 5e-5.
Z = 5.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="module")
def policy(model_dir):
    return HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)


def test_logprobs_are_the_trainers_and_batching_changes_nothing(policy):
    prompts = ragged_prompts(6, seed=0)
    # 5 rows a forward: several batches, each left-padded to its own longest prompt
    completions = HFGenerator(policy.model, policy.device, 0, 5).generate(prompts, 3, sampling())
    assert [(c.prompt_index, c.sample_index) for c in completions] == [
        (i, j) for i in range(6) for j in range(3)
    ]
    batch = build_batch(
        [prompts[c.prompt_index] for c in completions],
        [c.token_ids for c in completions],
        torch.zeros(len(completions)),
        0,
        [c.logprobs for c in completions],
    )
    stats = policy.token_stats(batch)
    bound = logprob_bound(policy.model, batch.input_ids, batch.attention_mask, TEMPERATURE)
    bound = bound[:, :-1][batch.response_mask]
    diff = (stats.logprob - batch.rollout_logprob)[batch.response_mask].abs()
    assert bool((diff <= bound).all()), float((diff / bound).max())
    assert 0 < float(bound.max()) < 1e-2  # tight enough to catch a shifted position (~0.1 nat)

    again = HFGenerator(policy.model, policy.device, 0, 18).generate(prompts, 3, sampling())
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]
    other = HFGenerator(policy.model, policy.device, 0, 18).generate(prompts, 3, sampling(seed=4))
    assert [c.token_ids for c in other] != [c.token_ids for c in completions]


def test_a_prompts_forward_runs_once_for_all_its_samples(policy):
    """Three distinct prompts (one of them given twice) × 4 samples in one batch: the prompt's
    forward sees the 3 distinct prompts, each one-token forward only the rows that go on, and
    every row samples what it samples alone (one row a forward, nothing shared), its logprobs
    within the reduction-order bound of the trainer's."""
    prompts = ragged_prompts(3, seed=5)
    prompts.append(list(prompts[1]))
    widths: list[tuple[int, int]] = []

    def record(module, args, kwargs):
        widths.append(tuple(kwargs["hidden_states"].shape[:2]))

    attention = policy.model.model.layers[0].self_attn
    hook = attention.register_forward_pre_hook(record, with_kwargs=True)
    try:
        shared = HFGenerator(policy.model, policy.device, 0, 16).generate(prompts, 4, sampling())
    finally:
        hook.remove()
    assert widths[0] == (3, max(len(p) for p in prompts))
    lengths = [len(c.token_ids) for c in shared]
    assert [rows for rows, _ in widths[1:]] == [
        sum(length > step for length in lengths) for step in range(1, max(lengths))
    ]
    assert widths[1][0] < 16  # a row ended after its first token and left
    alone = HFGenerator(policy.model, policy.device, 0, 1).generate(prompts, 4, sampling())
    assert [c.token_ids for c in shared] == [c.token_ids for c in alone]
    both = build_batch(
        [prompts[c.prompt_index] for c in alone],
        [c.token_ids for c in alone],
        torch.zeros(len(alone)),
        0,
        [c.logprobs for c in alone],
    )
    bound = logprob_bound(policy.model, both.input_ids, both.attention_mask, TEMPERATURE)
    got = torch.tensor([lp for c in shared for lp in c.logprobs], dtype=torch.float64)
    want = both.rollout_logprob[both.response_mask].double()
    assert bool(((got - want).abs() <= bound[:, :-1][both.response_mask]).all())


def test_stop_tokens_end_a_sample_that_length_caps_otherwise(policy):
    """With and without stop ids the same seeded samples, the stopped one cut right after its
    first stop token; its logprobs within the reduction-order bound (the stopped rows leave
    the batch, so the others decode beside other rows)."""
    prompts = ragged_prompts(8, seed=1)
    generator = HFGenerator(policy.model, policy.device, 0, 64)
    free = generator.generate(prompts, 4, sampling(stop_token_ids=()))
    stopped = generator.generate(prompts, 4, sampling())
    assert all(c.finish_reason == "length" and len(c.token_ids) == 12 for c in free)
    reasons = {c.finish_reason for c in stopped}
    assert reasons == {"stop", "length"}  # the settings exercise both
    rows = build_batch(
        [prompts[c.prompt_index] for c in free],
        [c.token_ids for c in free],
        torch.zeros(len(free)),
        0,
        [c.logprobs for c in free],
    )
    bounds = logprob_bound(policy.model, rows.input_ids, rows.attention_mask, TEMPERATURE)
    for row, (f, s) in enumerate(zip(free, stopped, strict=True)):
        hits = [t for t, token in enumerate(f.token_ids) if token in STOP]
        # the same seeded sample, cut right after its first stop token (kept, like vLLM's)
        end = hits[0] + 1 if hits else 12
        assert s.token_ids == f.token_ids[:end]
        assert s.finish_reason == ("stop" if hits else "length")
        start = len(prompts[f.prompt_index]) - 1
        bound = bounds[row, start : start + end].double()
        diff = torch.tensor(s.logprobs, dtype=torch.float64) - torch.tensor(f.logprobs[:end])
        assert bool((diff.abs() <= bound).all())


def test_one_token_forwards_attend_eagerly_on_cpu_and_the_models_own_returns(policy):
    """The prompt's forward keeps the model's attention, each one-token forward runs transformers'
    ``eager`` attention (docs/performance.md, "A real model's step beside TRL"), and the model
    attends as before once generation ends, also after a call that failed while decoding."""
    own = policy.model.config._attn_implementation
    assert own != "eager"  # the check below could not tell the two apart otherwise
    seen: list[tuple[int, str]] = []
    fail = []

    def record(module, args, kwargs):
        seen.append((kwargs["hidden_states"].shape[1], module.config._attn_implementation))
        if fail and kwargs["hidden_states"].shape[1] == 1:
            raise RuntimeError("a failure inside a one-token forward")

    attention = policy.model.model.layers[0].self_attn
    hook = attention.register_forward_pre_hook(record, with_kwargs=True)
    generator = HFGenerator(policy.model, policy.device, 0, 64)
    try:
        generator.generate([[3, 4, 5, 6]], 2, sampling(stop_token_ids=()))
        assert seen[0] == (4, own)
        assert seen[1:] == [(1, "eager")] * 11
        assert policy.model.config._attn_implementation == own
        fail.append(True)
        with pytest.raises(RuntimeError, match="one-token forward"):
            generator.generate([[3, 4]], 1, sampling(stop_token_ids=()))
    finally:
        hook.remove()
    assert seen[-1] == (1, "eager")
    assert policy.model.config._attn_implementation == own


def first_token_distribution(policy, prompt: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt])).logits[0, -1].double()
    return torch.softmax(logits / temperature, dim=-1)


def first_token_bound(policy, prompt: list[int], temperature: float) -> float:
    ids = torch.tensor([prompt])
    return float(logprob_bound(policy.model, ids, torch.ones_like(ids), temperature)[0, -1])


def frequency_bound(probs: torch.Tensor, samples: int) -> torch.Tensor:
    """Per-token count tolerance: Z binomial standard deviations, plus one for rounding."""
    return Z * (samples * probs * (1 - probs)).sqrt() + 1


def first_tokens(policy, prompt, samples, **settings) -> list:
    generator = HFGenerator(policy.model, policy.device, 0, samples)
    return generator.generate([prompt], samples, sampling(max_new_tokens=1, **settings))


@pytest.mark.parametrize("temperature", [0.5, 1.5])
def test_first_token_frequencies_follow_the_tempered_softmax(policy, temperature):
    prompt, samples = [10, 20, 30], 4000
    completions = first_tokens(policy, prompt, samples, temperature=temperature, seed=11)
    counts = torch.bincount(
        torch.tensor([c.token_ids[0] for c in completions]), minlength=policy.model.vocab_size
    ).double()
    probs = first_token_distribution(policy, prompt, temperature)
    assert bool(((counts - samples * probs).abs() <= frequency_bound(probs, samples)).all())
    # the check can tell a neighbouring temperature apart
    wrong = first_token_distribution(policy, prompt, temperature * 1.3)
    assert not bool(((counts - samples * wrong).abs() <= frequency_bound(wrong, samples)).all())
    logprobs = torch.tensor([c.logprobs[0] for c in completions], dtype=torch.float64)
    want = probs.log()[torch.tensor([c.token_ids[0] for c in completions])]
    bound = first_token_bound(policy, prompt, temperature)
    assert bool(((logprobs - want).abs() <= bound).all())


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (0, 0.6), (8, 0.7)])
def test_top_k_and_top_p_sample_the_renormalised_kept_set(policy, top_k, top_p):
    prompt, samples, temperature = [12, 4, 40], 3000, 1.5
    probs = first_token_distribution(policy, prompt, temperature)
    # brute force: the top_k most probable, then the most probable of those up to top_p mass
    order = probs.argsort(descending=True).tolist()
    kept = order[:top_k] if top_k else order
    mass, nucleus = probs[kept].sum(), []
    for token in kept:
        nucleus.append(token)
        if probs[nucleus].sum() / mass >= top_p:
            break
    assert 1 < len(nucleus) < len(order)  # the cut is active and keeps a choice
    truncated = torch.zeros_like(probs)
    truncated[nucleus] = probs[nucleus] / probs[nucleus].sum()
    completions = first_tokens(
        policy, prompt, samples, temperature=temperature, top_k=top_k, top_p=top_p, seed=5
    )
    tokens = torch.tensor([c.token_ids[0] for c in completions])
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    assert set(tokens.tolist()) <= set(nucleus)
    bound = frequency_bound(truncated, samples)
    assert bool(((counts - samples * truncated).abs() <= bound).all())
    logprobs = torch.tensor([c.logprobs[0] for c in completions], dtype=torch.float64)
    want = truncated.log()[tokens]
    bound = first_token_bound(policy, prompt, temperature)
    assert bool(((logprobs - want).abs() <= bound).all())


def test_temperature_zero_is_greedy_with_the_unscaled_logprob(policy):
    prompts = ragged_prompts(3, seed=2)
    completions = HFGenerator(policy.model, policy.device, 0, 8).generate(
        prompts, 2, sampling(temperature=0.0, stop_token_ids=(), max_new_tokens=4)
    )
    for c in completions:
        ids = prompts[c.prompt_index] + c.token_ids
        with torch.no_grad():
            logits = policy.model(torch.tensor([ids])).logits[0].double()
        steps = logits[len(prompts[c.prompt_index]) - 1 : -1]
        ids_t = torch.tensor([ids])
        bound = logprob_bound(policy.model, ids_t, torch.ones_like(ids_t), 1.0)[0, :-1]
        bound = bound[len(prompts[c.prompt_index]) - 1 :]
        top2 = steps.topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > bound  # rounding cannot swap the two best there
        assert bool(clear.any())
        best = steps.argmax(dim=-1)
        assert torch.tensor(c.token_ids)[clear].tolist() == best[clear].tolist()
        want = torch.log_softmax(steps, dim=-1).gather(1, torch.tensor(c.token_ids)[:, None])
        got = torch.tensor(c.logprobs, dtype=torch.float64)
        assert bool(((got - want[:, 0]).abs() <= bound).all())


def test_the_engine_backend_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match=r"rollout\.name.*engine=megatron"):
        compose(["rollout=engine", "engine=megatron"])
    with pytest.raises(ValueError, match=r"rollout\.name"):
        compose(["rollout.name=sglang"])
    assert compose(["rollout=engine"])[0].rollout.name == "engine"


def test_a_short_run_trains_on_its_own_samples(model_dir, tmp_path):
    out = tmp_path / "run"
    # the random tiny model (no warm start to build): the mechanics, not the learning
    overrides = run_overrides(model_dir, out, ["model=local", "rollout=engine"])
    config, config_dict = compose(overrides)
    trainer = build_trainer(config, config_dict, out)
    assert isinstance(trainer.rollout, HFGenerator)
    assert trainer.run() == "done"
    for record in read_metrics(out / "metrics.jsonl"):
        assert record["train/skipped_updates"] == 0 and record["response/length_mean"] > 0
        # the sampler's logprobs are the trainer's up to fp32 rounding of the logits (above):
        # far below the 0.2-nat threshold, in mean absolute difference per token
        assert record["fidelity/frac_beyond"] == 0
        scale = 1 + record["entropy/mean"]
        assert record["fidelity/abs_logprob_diff"] <= 1e-4 * scale
        assert math.isfinite(record["flow/lambda"])
