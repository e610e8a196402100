"""The aligner path end to end on CPU, NeMo's restore aside: the real ``Trainer`` on two gloo
ranks, each holding ``MegatronPolicy`` over its tensor-parallel half (TP 2) of a real
megatron-core ``GPTModel``, generating through a real ``ColocatedRollout`` (one vLLM CPU server
for the group of ``engine.rollout_tp_size`` = 2 ranks: rank 1 only walks the weight stream).

Reference: the single-process ``hf`` run on the same warm-started tiny model, data and seeds
(``conftest.make_trainer``), whose vLLM server (the same kind) is refitted from ``HFPolicy``.

- Every step's completions (prompts, sampling, tokens) equal the reference's, and the server's
  logprobs of them agree: steps 2 and 3 sample from the refitted weights, so they can only agree
  if ``MegatronPolicy.named_weights()`` (TP gathers on both ranks, drained on rank 1) refitted the
  server with the trained weights; the test checks that the initial weights give other logprobs.
- Every step's metrics equal the reference's within fp32 round-off (:data:`METRIC_REL`).
- The step-2 checkpoint (megatron ``torch_dist`` shards from both ranks, both ranks' RNG states)
  resumed into a fresh policy and trainer repeats the uninterrupted run's step 3.
"""

from __future__ import annotations

import datetime
import json

import pytest

from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.rollout import SamplingConfig
from opefo_nemo.trainer.metrics_log import read_metrics
from tests.parallel.world import run_world
from tests.trainer.conftest import run_overrides

pytest.importorskip("megatron.core")
from tests.trainer import workers_aligner_loop  # imports megatron-core helpers

pytestmark = pytest.mark.vllm

#: Both runs: 3 steps at an lr that visibly moves the tiny model (warm-up over 2 steps), AdamW ε
#: 1e-4 (with 1e-8 an element whose gradient is zero in exact arithmetic, e.g. the key bias's,
#: takes a ±lr step decided by round-off), flow/realized on step 2.
COMMON = (
    "trainer.max_steps=3",
    "method.lr=1e-3",
    "engine.warmup_steps=2",
    "engine.adam_eps=1e-4",
    "metrics.realized_every=2",
)
ALIGNER = (
    "engine=aligner",
    *COMMON,
    "engine.dtype=float32",
    "engine.tensor_model_parallel_size=2",
    "engine.transformer_engine=false",
    "engine.micro_batch_size=4",
    "engine.make_vocab_size_divisible_by=8",
    "engine.rollout_tp_size=2",
    "checkpoint.every=2",
)
#: Metrics: fp32 round-off of different reduction orders (TP-split matmuls, vocab-parallel
#: softmax sums, 4 micro-batches of 4 against one of 16) carried through three AdamW steps.
METRIC_REL, METRIC_ABS = 1e-4, 1e-6
#: The server's logprobs of the same tokens under weights equal up to that round-off.
LOGPROB_ABS = 1e-4
STEADY = ("time/", "rollout/restarts")
SERVER_START = {"group_timeout": datetime.timedelta(seconds=300), "deadline_s": 900.0}


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(STEADY)}


def _assert_metrics_close(got: list[dict], want: list[dict]) -> None:
    assert [row["step"] for row in got] == [row["step"] for row in want]
    for a, b in zip(got, want, strict=True):
        a, b = _comparable(a), _comparable(b)
        assert a.keys() == b.keys(), a["step"]
        for key, value in b.items():
            assert a[key] == pytest.approx(value, rel=METRIC_REL, abs=METRIC_ABS), (a["step"], key)


def _assert_same_generation(got: dict, want: dict, step: int) -> None:
    assert got["prompts"] == want["prompts"], step
    assert got["sampling"] == want["sampling"], step
    assert got["completions"] == want["completions"], step
    for ours, theirs in zip(got["logprobs"], want["logprobs"], strict=True):
        assert ours == pytest.approx(theirs, abs=LOGPROB_ABS), step


def _stale_logprob_gap(rollout, model, call: dict) -> float:
    """``call`` regenerated with the model's initial weights: the largest logprob difference
    (infinite where the tokens differ)."""
    rollout.update_weights(HFPolicy(model, _hf_engine(), lr=1e-3, temperature=1.0).named_weights())
    sampling = SamplingConfig(
        **{**call["sampling"], "stop_token_ids": tuple(call["sampling"]["stop_token_ids"])}
    )
    stale = rollout.generate(call["prompts"], call["n"], sampling)
    if [[c.prompt_index, c.token_ids, c.finish_reason] for c in stale] != call["completions"]:
        return float("inf")
    return max(
        abs(a - b)
        for c, theirs in zip(stale, call["logprobs"], strict=True)
        for a, b in zip(c.logprobs, theirs, strict=True)
    )


def _hf_engine():
    from opefo_nemo.config.train import EngineConfig

    return EngineConfig(dtype="float32")


def test_trainer_on_megatron_tp2_matches_hf_refits_and_resumes(
    make_trainer, shared_rollout, warm_model, tmp_path
):
    reference = make_trainer(COMMON, tmp_path / "single")
    reference.rollout = workers_aligner_loop.RecordingRollout(reference.rollout)
    assert reference.run() == "done"
    expected = read_metrics(tmp_path / "single" / "metrics.jsonl")
    expected_calls = json.loads(json.dumps(reference.rollout.calls))  # as the ranks report them
    assert len(expected_calls) == 3

    out = tmp_path / "aligner"
    overrides = run_overrides(warm_model, out, ALIGNER)
    run_world(workers_aligner_loop.run_and_resume, 2, overrides, str(out), **SERVER_START)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0] == reports[1]  # the gathered completions and decisions, on both ranks
    status, steps, calls = reports[0]["straight"]
    assert (status, steps, len(calls)) == ("done", 3, 3)
    for step, (got, want) in enumerate(zip(calls, expected_calls, strict=True), start=1):
        _assert_same_generation(got, want, step)
    _assert_metrics_close(read_metrics(out / "straight" / "metrics.jsonl"), expected)

    # the refit has teeth: step 2 sampled with the initial weights is told apart
    assert _stale_logprob_gap(shared_rollout, warm_model, expected_calls[1]) > 100 * LOGPROB_ABS

    checkpoint = out / "straight" / "checkpoints" / "step_000002"
    for name in ("trainer_state.json", "rng.pt", "rng_rank1.pt", "config.yaml", "policy"):
        assert (checkpoint / name).exists(), name
    status, resumed_at, steps, calls = reports[0]["resumed"]
    assert (status, resumed_at, steps, len(calls)) == ("done", 2, 3, 1)
    assert calls[0] == reports[0]["straight"][2][2]  # the same tokens and logprobs, bit for bit
    (step3,) = read_metrics(out / "resumed" / "metrics.jsonl")
    straight3 = read_metrics(out / "straight" / "metrics.jsonl")[2]
    assert _comparable(step3) == _comparable(straight3)  # exactly the uninterrupted step 3
