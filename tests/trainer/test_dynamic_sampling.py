"""Dynamic sampling (spec §4, ``trainer/dynamic_sampling.py``) against brute force: the groups a
step keeps from the rounds it generates (plain-Python sets of each group's rewards), an update
over exactly those groups (the same update of a batch built by hand from them), a step that keeps
none (no update, nothing non-finite), resume, and two ranks against one process. No vLLM: the
``hf`` engine samples (``rollout=engine``) from the shipped demo model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from opefo_nemo.config.compose import compose
from opefo_nemo.config.run import SEEDS_PER_STEP, TrainerConfig
from opefo_nemo.core import group_advantages
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.probe.step import NothingToProbeError, probe
from opefo_nemo.rewards import RewardResult
from opefo_nemo.rollout import Completion
from opefo_nemo.trainer.dynamic_sampling import ScoredRound, sample_step
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.sampler import PromptSampler
from opefo_nemo.trainer.scoring import score_responses
from opefo_nemo.trainer.setup import build_trainer
from opefo_nemo.trainer.update import update_rollout_batch
from tests.metric_bounds import assert_metrics_close
from tests.parallel.world import run_world
from tests.trainer import workers_dynamic_sampling

P, K = 4, 4
SMALL = (
    f"trainer.prompts_per_step={P}",
    f"trainer.responses_per_prompt={K}",
    "trainer.max_steps=2",
    "trainer.dynamic_sampling=true",
    "trainer.dynamic_sampling_max_rounds=3",
    "rollout=engine",
    "metrics.progress=false",
    "metrics.tensorboard=false",
    "checkpoint.every=0",
)


def overrides(model: Path, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return [f"model.path={model}", f"run.output_dir={out}", *SMALL, *extra]


def make(model: Path, out: Path, extra: tuple[str, ...] = ()) -> Trainer:
    config, config_dict = compose(overrides(model, out, extra))
    return build_trainer(config, config_dict, out)


def first_with_signal(tables, wanted: int, multiple: int) -> tuple[list[tuple[int, int]], int]:
    """Brute force over each round's reward table ``[prompt][response]``: the rounds that run
    (until ``wanted`` groups have two different rewards) and the first ``wanted`` such groups,
    dropping the last ones until ``multiple`` divides their count."""
    candidates, rounds = [], 0
    for r, table in enumerate(tables):
        rounds = r + 1
        candidates += [(r, p) for p, rewards in enumerate(table) if len(set(rewards)) > 1]
        if len(candidates) >= wanted:
            break
    kept = candidates[:wanted]
    while len(kept) % multiple:
        kept.pop()
    return kept, rounds


def synthetic_round(table: list[list[float]], r: int) -> ScoredRound:
    """A scored round of the reward ``table``; response ``(p, j)`` of round ``r`` has the token
    ids ``[r, p, j]``, so that a kept row says which it is."""
    completions = [
        Completion(p, j, [r, p, j], [0.0] * 3, "stop")
        for p, rewards in enumerate(table)
        for j in range(len(rewards))
    ]
    results = [RewardResult(v, None, "wrong") for rewards in table for v in rewards]
    rewards = torch.tensor([v for rewards in table for v in rewards])
    prompts = [[r, p] for p in range(len(table))]
    return ScoredRound(prompts, completions, results, [0.0] * len(results), rewards, 0.0)


@pytest.mark.parametrize(
    ("prompts", "k", "updates", "max_rounds"),
    [(4, 4, 1, 3), (5, 3, 1, 1), (6, 4, 8, 4), (3, 2, 4, 5), (8, 8, 1, 2)],
)
@pytest.mark.parametrize("seed", range(4))
def test_the_kept_groups_are_a_brute_force_filters(prompts, k, updates, max_rounds, seed):
    g = torch.Generator().manual_seed(seed)
    tables = []
    for _ in range(max_rounds):  # each group: always right, always wrong, or a coin (with a
        kind = torch.randint(3, (prompts,), generator=g)  # penalty-like fraction at times)
        coins = torch.randint(2, (prompts, k), generator=g).double()
        fraction = torch.randint(2, (prompts, k), generator=g) * 0.25
        rewards = torch.where(kind[:, None] == 2, coins - fraction, kind[:, None].double())
        tables.append(rewards.tolist())
    settings = TrainerConfig(
        prompts_per_step=prompts,
        responses_per_prompt=k,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=max_rounds,
    )
    generated: list[int] = []

    def generate(r: int) -> ScoredRound:
        generated.append(r)
        return synthetic_round(tables[r], r)

    sample = sample_step(generate, settings, updates)
    multiple = updates // math.gcd(updates, k)
    kept, rounds = first_with_signal(tables, prompts, multiple)
    assert generated == list(range(rounds))
    training = sample.training()
    assert [c.token_ids[:2] for c in training.completions[::k]] == [list(g) for g in kept]
    assert training.group_ids.tolist() == [i for i in range(len(kept)) for _ in range(k)]
    assert training.rewards.tolist() == [v for r, p in kept for v in tables[r][p]]
    assert training.rows % updates == 0
    with_signal = sum(len(set(row)) > 1 for table in tables[:rounds] for row in table)
    assert sample.metrics() == {
        "sampling/rounds": rounds,
        "sampling/groups_kept": len(kept),
        "sampling/groups_dropped": rounds * prompts - with_signal,
        "sampling/groups_surplus": with_signal - len(kept),
    }
    assert sample.generated().rows == rounds * prompts * k


def test_without_dynamic_sampling_every_group_of_one_round_is_kept():
    table = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    sample = sample_step(lambda r: synthetic_round(table, r), TrainerConfig(), 1)
    assert sample.kept == [(0, 0), (0, 1), (0, 2)] and sample.metrics() == {}


def test_a_step_trains_on_the_groups_a_brute_force_filter_keeps(demo_model, tmp_path):
    trainer = make(demo_model, tmp_path / "dynamic", ("method=opefo",))
    reference = make(demo_model, tmp_path / "reference", ("method=opefo",))  # the same weights
    calls = []
    generate = trainer.rollout.generate

    def recorded(prompts, n, sampling):
        completions = generate(prompts, n, sampling)
        calls.append((prompts, sampling.seed, completions))
        return completions

    trainer.rollout.generate = recorded  # type: ignore[method-assign]
    metrics = trainer.train_step()

    # every round: the sampler's next prompts, seeds of their own
    sampler = PromptSampler(len(trainer.train.prompts), P, trainer.config.run.seed)
    for prompts, _, _ in calls:
        assert prompts == [trainer.train.prompts[i] for i in sampler.next_batch()]
    seeds = [seed for _, seed, _ in calls]
    assert seeds[0] == trainer.config.run.seed * 1_000_003 * SEEDS_PER_STEP
    ranges = [set(range(seed, seed + P * K)) for seed in seeds]
    assert all(not (a & b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    assert max(seeds) + P * K <= (trainer.config.run.seed * 1_000_003 + 1) * SEEDS_PER_STEP

    # brute force: score every response, keep the first P groups whose rewards differ
    problems = PromptSampler(len(trainer.train.prompts), P, trainer.config.run.seed)
    tables, rows = [], []
    for prompts, _, completions in calls:
        indices = problems.next_batch()
        responses = [trainer.codec.decode(c.token_ids) for c in completions]
        truths = [trainer.train.problems[indices[c.prompt_index]].ground_truth for c in completions]
        scores = [r.score for r in score_responses(responses, truths, trainer.config.reward)]
        tables.append([scores[p * K : (p + 1) * K] for p in range(len(prompts))])
        rows.append((prompts, completions))
    kept, rounds = first_with_signal(tables, P, 1)
    assert len(calls) == rounds >= 2 and len(kept) == P  # the filter had work to do
    assert metrics["sampling/groups_dropped"] >= 1
    prompts = [rows[r][0][p] for r, p in kept for _ in range(K)]
    completions = [rows[r][1][p * K + j] for r, p in kept for j in range(K)]
    rewards = torch.tensor([v for r, p in kept for v in tables[r][p]])
    advantages = group_advantages(rewards, torch.arange(P).repeat_interleave(K))
    batch = build_batch(
        prompts,
        [c.token_ids for c in completions],
        advantages,
        trainer.codec.pad_id,
        [c.logprobs for c in completions],
    )
    want = update_rollout_batch(
        reference.policy,
        reference.objective,
        batch,
        reference.config.engine.micro_batch_size,
        seed=reference.update_seed(),
        batch_layout=reference.config.engine.batch_layout,
        max_tokens_per_micro_batch=reference.config.engine.max_tokens_per_micro_batch,
        attention_width=reference.attention_width,  # the work perf/pad_fraction counts
    ).metrics
    # the same operations on the same batch in this process: λ*, the token count, every flow
    assert {name: metrics[name] for name in want} == want
    theirs = dict(reference.policy.model.named_parameters())
    for name, weight in trainer.policy.model.named_parameters():
        assert torch.equal(weight, theirs[name]), name


def test_a_step_without_any_group_with_signal_makes_no_update(model_dir, tmp_path):
    out = tmp_path / "run"
    # the random tiny model answers nothing right: every reward is 0, no group has signal
    extra = ("model=local", "trainer.dynamic_sampling_max_rounds=2")
    trainer = make(model_dir, out, extra)
    before = {name: weight.clone() for name, weight in trainer.policy.model.named_parameters()}
    lr = trainer.policy.lr  # in the warm-up, which moves it at every update
    assert trainer.run() == "done"
    assert trainer.policy.lr == lr
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["sampling/groups_kept"] == 0 and record["sampling/rounds"] == 2
        assert record["sampling/groups_dropped"] == 2 * P
        assert record["reward/group_signal_frac"] == 0 and record["train/skipped_updates"] == 0
        assert not any(name.startswith(("flow/", "entropy/", "loss", "grad/")) for name in record)
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))
    for name, weight in trainer.policy.model.named_parameters():
        assert torch.equal(weight, before[name]), name
    sampler = PromptSampler(len(trainer.train.prompts), P, trainer.config.run.seed)
    for _ in range(4):  # two rounds in each of two steps
        sampler.next_batch()
    assert trainer.sampler.state_dict() == sampler.state_dict()
    with pytest.raises(NothingToProbeError, match=r"trainer\.dynamic_sampling_max_rounds"):
        probe(make(model_dir, tmp_path / "probe", extra))


def test_a_resumed_run_equals_an_uninterrupted_one(demo_model, tmp_path):
    common = ("trainer.max_steps=3", "checkpoint.every=2", "method.lr=1e-3")
    straight = make(demo_model, tmp_path / "straight", common)
    assert straight.run() == "done"
    expected = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    assert sum(r["sampling/rounds"] for r in expected) > 3  # extra rounds moved the sampler

    checkpoint = tmp_path / "straight" / "checkpoints" / "step_000002"
    resumed = make(demo_model, tmp_path / "resumed", (*common, f"checkpoint.resume={checkpoint}"))
    assert resumed.step == 2 and resumed.run() == "done"
    (step3,) = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    steady = lambda row: {k: v for k, v in row.items() if not k.startswith("time/")}  # noqa: E731
    assert steady(step3) == steady(expected[2])

    sampler = PromptSampler(len(straight.train.prompts), P, straight.config.run.seed)
    for _ in range(int(expected[0]["sampling/rounds"] + expected[1]["sampling/rounds"])):
        sampler.next_batch()
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["sampler"] == sampler.state_dict()


def test_two_ranks_keep_and_train_on_what_one_process_does(demo_model, tmp_path):
    extra = ("method=opefo", "method.lr=1e-3")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs
    try:
        single = make(demo_model, tmp_path / "single", extra)
        want = workers_dynamic_sampling.steps(single, 2)
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "ranks"
    run_world(workers_dynamic_sampling.two_ranks, 2, overrides(demo_model, out, extra), str(out))
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0]["kept"] == reports[1]["kept"] == want["kept"]
    assert any(m["sampling/groups_dropped"] for m in want["metrics"])
    for report in reports:
        for got, expected in zip(report["metrics"], want["metrics"], strict=True):
            assert_metrics_close(got, expected, rel=1e-5)
