"""``engine=megatron`` end to end on CPU ranks (``engine.device=cpu``): the real ``Trainer`` on
two gloo ranks driving the policy ``build_policy`` builds (a megatron-core ``GPTModel`` from the
Hugging Face directory, megatron DDP and optimizer), generating through a real
``ColocatedRollout`` (one vLLM CPU server for the group of ``engine.rollout_tp_size`` = 2 ranks:
rank 1 owns none and only walks the weight stream), in two layouts one after the other in the same
world: TP 2 with sequence parallelism (each rank holds half of every layer and of the vocabulary,
and half of each sequence's norm activations) and DP 2 with the distributed optimizer (each rank
holds the whole model, half of the micro-batches and half of the Adam state).

Reference: the single-process ``hf`` run on the same warm-started tiny model, data and seeds,
whose vLLM server (the same kind) is refitted from ``HFPolicy``. Per layout:

- every step's ``generate`` call (prompts, sampling, tokens) equals the reference's, and the
  server's logprobs of the tokens agree: steps 2 and 3 sample from refitted weights, so they can
  only agree if ``MegatronPolicy.named_weights()`` (collective) refitted the server with the
  trained weights (:func:`test_initial_weights_are_told_apart` shows the check has teeth);
- every step's metrics equal the reference's within fp32 round-off (:data:`METRIC_REL`), among
  them step 3's ``flow/drift`` (it closes step 2's ``flow/realized``) and the held-out
  ``val/avg@4`` and ``val/pass@k`` of the warm start (step 0) and of step 3, whose ``generate``
  calls are compared with the reference's like the training steps';
- the step-2 checkpoint (megatron ``torch_dist`` shards of the weights and of megatron's
  optimizer from both ranks, both ranks' RNG states) resumed into a fresh policy and trainer
  repeats the uninterrupted run's step 3 exactly.
"""

from __future__ import annotations

import datetime
import json

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.rollout import SamplingConfig
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer
from tests.metric_bounds import assert_metrics_close, balanced_flow_bound
from tests.parallel.world import run_world
from tests.trainer.small_run import run_overrides

pytest.importorskip("megatron.core")
from tests.trainer import workers_megatron_loop  # imports megatron-core helpers

pytestmark = pytest.mark.vllm

#: Every run: 3 steps at an lr that visibly moves the tiny model (warm-up over 2 steps), AdamW ε
#: 1e-4 (with 1e-8 an element whose gradient is zero in exact arithmetic, e.g. the key bias's,
#: takes a ±lr step decided by round-off), flow/realized on step 2 (flow/drift on step 3),
#: validation of 4 held-out problems × 4 samples at steps 0 and 3.
COMMON = (
    "trainer.max_steps=3",
    "method.lr=1e-3",
    "engine.warmup_steps=2",
    "engine.adam_eps=1e-4",
    "metrics.realized_every=2",
    "validation.every=3",
    "validation.k=4",
    "validation.max_problems=4",
)
#: The ``generate`` calls of a run: validation (step 0), steps 1–3, validation (step 3).
CALLS = 5
MEGATRON = (
    "engine=megatron",
    *COMMON,
    "engine.device=cpu",
    "engine.dtype=float32",
    "engine.make_vocab_size_divisible_by=8",
    "engine.rollout_tp_size=2",
    "checkpoint.every=2",
)
#: The layouts on the two ranks. 16 responses a step: TP 2 × sequence parallel in micro-batches
#: of 4; DP 2 with the distributed optimizer in micro-batches of 3 (six, the last of one
#: response; three per data-parallel rank).
LAYOUTS = {
    "tp2_sp": (
        "engine.tensor_model_parallel_size=2",
        "engine.sequence_parallel=true",
        "engine.micro_batch_size=4",
    ),
    "dp2_distopt": (
        "engine.tensor_model_parallel_size=1",
        "engine.use_distributed_optimizer=true",
        "engine.micro_batch_size=3",
    ),
}
#: Metrics: fp32 round-off of different reduction orders (TP-split matmuls, vocab-parallel
#: softmax sums, micro-batches against one batch of 16, DP gradient average) carried through
#: three AdamW steps; seen up to ~1e-5 relative (grad/norm at step 3), each relative to the
#: terms it is computed from (tests/metric_bounds.py).
METRIC_REL = 1e-4
#: The server's logprobs of the same tokens under weights equal up to that round-off, relative
#: to the largest |logprob| of the step.
LOGPROB_REL = 1e-4
STEADY = ("time/", "rollout/restarts")
SERVER_START = {"group_timeout": datetime.timedelta(seconds=300), "deadline_s": 900.0}


@pytest.fixture(scope="module")
def runs(warm_model, shared_rollout, tmp_path_factory):
    """The reference's metrics and ``generate`` calls, and the layouts' output folders."""
    root = tmp_path_factory.mktemp("megatron_loop")
    config, config_dict = compose(run_overrides(warm_model, root / "single", COMMON))
    reference = build_trainer(config, config_dict, root / "single", shared_rollout)
    reference.rollout = workers_megatron_loop.RecordingRollout(reference.rollout)
    assert reference.run() == "done"
    calls = json.loads(json.dumps(reference.rollout.calls))  # as the ranks report them
    assert len(calls) == CALLS

    layouts = {
        name: run_overrides(warm_model, root / name, [*MEGATRON, *settings])
        for name, settings in LAYOUTS.items()
    }
    run_world(workers_megatron_loop.run_and_resume, 2, layouts, str(root), **SERVER_START)
    return read_metrics(root / "single" / "metrics.jsonl"), calls, root


def _comparable(row: dict, *left_out: str) -> dict:
    return {k: v for k, v in row.items() if not k.startswith((*STEADY, *left_out))}


def _assert_metrics_close(got: list[dict], want: list[dict]) -> None:
    assert [row["step"] for row in got] == [row["step"] for row in want]
    for a, b in zip(got, want, strict=True):
        assert_metrics_close(_comparable(a), _comparable(b), rel=METRIC_REL)


def _assert_same_generation(got: dict, want: dict, step: int) -> None:
    assert got["prompts"] == want["prompts"], step
    assert got["sampling"] == want["sampling"], step
    assert got["completions"] == want["completions"], step
    bound = _logprob_bound(want)
    for ours, theirs in zip(got["logprobs"], want["logprobs"], strict=True):
        assert ours == pytest.approx(theirs, rel=0, abs=bound), step


def _logprob_bound(call: dict) -> float:
    """:data:`LOGPROB_REL` of the largest |logprob| of a ``generate`` call's tokens."""
    return LOGPROB_REL * max((abs(x) for row in call["logprobs"] for x in row), default=0.0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_trainer_on_megatron_policy_matches_hf_refits_and_resumes(runs, layout):
    expected, expected_calls, root = runs
    out = root / layout
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0] == reports[1]  # the gathered completions and decisions, on both ranks
    status, steps, calls = reports[0]["straight"]
    assert (status, steps, len(calls)) == ("done", 3, CALLS)
    for step, (got, want) in enumerate(zip(calls, expected_calls, strict=True), start=1):
        _assert_same_generation(got, want, step)
    straight = read_metrics(out / "straight" / "metrics.jsonl")
    _assert_metrics_close(straight, expected)

    checkpoint = out / "straight" / "checkpoints" / "step_000002"
    for name in ("trainer_state.json", "rng.pt", "rng_rank1.pt", "config.yaml", "policy"):
        assert (checkpoint / name).exists(), name
    status, resumed_at, steps, resumed_calls = reports[0]["resumed"]
    assert (status, resumed_at, steps, len(resumed_calls)) == ("done", 2, 3, 2)
    assert resumed_calls[0] == calls[3]  # step 3: the same tokens and logprobs, bit for bit
    assert [row["step"] for row in straight] == [0, 1, 2, 3] and "flow/drift" in straight[3]
    (step3,) = read_metrics(out / "resumed" / "metrics.jsonl")
    # exactly the uninterrupted step 3 (its drift from the checkpointed step 2), up to the update;
    # its validation samples from the weights after it, which this comparison leaves out
    assert _comparable(step3, "val/") == _comparable(straight[3], "val/")


def test_initial_weights_are_told_apart(runs, shared_rollout, warm_model):
    """The reference's step 2 regenerated on the model's initial weights: where the tokens come
    out the same, their logprobs differ far beyond :func:`_logprob_bound`, so the refit checks above
    can fail (seen: one completion of 16 with other tokens, the others' logprobs up to 0.08
    apart)."""
    _, calls, _ = runs
    call = calls[2]
    initial = HFPolicy(warm_model, EngineConfig(dtype="float32"), lr=1e-3, temperature=1.0)
    shared_rollout.update_weights(initial.named_weights())
    sampling = call["sampling"]
    sampling = SamplingConfig(**{**sampling, "stop_token_ids": tuple(sampling["stop_token_ids"])})
    stale = shared_rollout.generate(call["prompts"], call["n"], sampling)
    same_tokens = [
        (c.logprobs, theirs)
        for c, tokens, theirs in zip(stale, call["completions"], call["logprobs"], strict=True)
        if [c.prompt_index, c.token_ids, c.finish_reason] == tokens
    ]
    gap = max(
        (abs(a - b) for ours, theirs in same_tokens for a, b in zip(ours, theirs, strict=True)),
        default=float("inf"),
    )
    assert gap > 10 * _logprob_bound(call)


#: The presets' engine settings on CPU ranks: bf16 parameters with fp32 main weights and the
#: distributed optimizer; their layout: TP 2 × sequence parallel × DP 2 (4 ranks, one vLLM server
#: for all).
PRESET_LAYOUT = (
    "engine.tensor_model_parallel_size=2",
    "engine.sequence_parallel=true",
    "engine.rollout_tp_size=4",
)
PRESET_ENGINE = (
    "engine=megatron",
    "engine.device=cpu",
    "engine.dtype=bfloat16",
    "engine.use_distributed_optimizer=true",
    "engine.micro_batch_size=2",
    "engine.make_vocab_size_divisible_by=8",
    "trainer.max_steps=2",
    "method.lr=1e-3",
    "engine.warmup_steps=2",
    "engine.adam_eps=1e-4",
)
#: bf16 logits of magnitude |z| ~ 20 are rounded to ε_bf16·|z|/2 ~ 0.04: the logprobs of the
#: sampled (mostly confident) tokens, their entropy flows and the gradient through ``1 − p`` move
#: by that much with any change of reduction order. Between layouts of the same engine (TP split
#: matmuls, the DP all-reduce, micro-batches) the step's token means, flow sums, λ* and gradient
#: norm therefore agree to a few per cent, not to fp32 round-off: 2⁻⁴ of the terms each is
#: computed from (tests/metric_bounds.py). Between the engines (other kernels, another rounding of
#: every logit) only the entropy, a smooth token mean, is compared (2⁻⁴); the flow sums of
#: near-certain tokens are differences of such rounded logprobs and are not.
BF16_REL = 2**-4
STEP_METRICS = ("entropy/mean", "flow/pos", "flow/neg", "flow/lambda", "loss", "grad/norm")


def test_preset_engine_settings_train_like_one_rank(warm_model, tmp_path):
    """The presets' engine settings (bf16 with fp32 main weights, TP 2 × sequence parallel,
    distributed optimizer, DP 2: 4 ranks) against ``engine=megatron`` in bf16 on one rank and
    against the ``hf`` engine in bf16, from the same weights: step 1's completions are identical
    in all three (the same bf16 weights in the same kind of vLLM server); the 4-rank step's
    entropy, flow sums, λ*, loss and gradient norm equal the one-rank step's within bf16
    round-off, its entropy the hf engine's; step 2 samples from the refitted weights and trains."""
    bf16 = ["engine.dtype=bfloat16", "trainer.max_steps=1", "method.lr=1e-3"]
    config, config_dict = compose(run_overrides(warm_model, tmp_path / "hf", bf16))
    reference = build_trainer(config, config_dict, tmp_path / "hf")
    reference.rollout = workers_megatron_loop.RecordingRollout(reference.rollout)
    try:
        assert reference.run() == "done"
    finally:
        reference.rollout.close()
    (hf_call,) = json.loads(json.dumps(reference.rollout.calls))
    (hf_metrics,) = read_metrics(tmp_path / "hf" / "metrics.jsonl")

    runs = {}
    for name, world, layout in (
        ("one_rank", 1, ("engine.rollout_tp_size=1",)),
        ("preset", 4, PRESET_LAYOUT),
    ):
        out = tmp_path / name
        overrides = run_overrides(warm_model, out, [*PRESET_ENGINE, *layout])
        run_world(workers_megatron_loop.run_straight, world, overrides, str(out), **SERVER_START)
        reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
        assert all(report == reports[0] for report in reports)
        status, steps, calls = reports[0]
        assert (status, steps, len(calls)) == ("done", 2, 2), name
        assert calls[0]["completions"] == hf_call["completions"], name
        runs[name] = read_metrics(out / "metrics.jsonl")
    one, preset = runs["one_rank"], runs["preset"]
    step = {key: preset[0][key] for key in STEP_METRICS}
    assert_metrics_close(step, {key: one[0][key] for key in STEP_METRICS}, rel=BF16_REL)
    entropy = preset[0]["entropy/mean"]
    assert entropy == pytest.approx(hf_metrics["entropy/mean"], rel=BF16_REL)
    # Σ w ΔH with the fp32 weights 1 ± λ*: zero up to their rounding
    assert abs(preset[0]["flow/net_after_balance"]) <= balanced_flow_bound(preset[0])
    # a real update: a step whose groups all had equal rewards has a zero gradient, so ask for one
    assert max(row["grad/norm"] for row in preset) > 0
