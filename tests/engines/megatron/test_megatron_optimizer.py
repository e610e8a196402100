"""``MegatronPolicy`` on megatron-core's ``DistributedDataParallel`` and ``get_megatron_optimizer``.

Two real gloo ranks (TP 1, DP 2) run the trainer's ``update_rollout_batch`` (OPEFO, clipping
active, warm-up) through megatron's real schedule, DDP gradient buffers, reduction
(all-reduce, or reduce-scatter + all-gather with the distributed optimizer) and optimizer
(megatron's fallback to ``torch.optim.AdamW`` without apex / Transformer Engine), on CPU
(:mod:`opefo_nemo.engines.megatron.cpu_execution`).

- fp32 parameters, distributed optimizer off and on (and on without clipping: megatron's
  ``clip_grad`` is then ``inf``): the token statistics, every metric (``grad/norm`` included)
  and every weight after the step equal ``HFPolicy``'s on the same weights and batch (the
  reference of ``test_policy.py``); a weight within how far Adam's first step moves over its
  gradient's uncertainty (``1e-4`` of the tensor's largest gradient, the metrics' agreement).
- bf16 parameters with fp32 main weights, distributed optimizer off: the norm megatron returns
  equals ``‖main_grad‖₂`` of the captured reduced gradients; the fp32 main weights after the step
  equal ``torch.optim.AdamW`` run in fp32 from the bf16-rounded starting weights with those
  gradients clipped by ``min(1, clip / (‖g‖ + 1e-6))``, within fp32 round-off (rtol 1e-6, atol
  1e-7: the same update formula, possibly another kernel); the bf16 parameters are the main
  weights rounded (checked on the ranks). As a plausibility check only, the bf16 norm is within
  10% of the fp32 ``HFPolicy`` norm (bf16 activations change the gradient itself).
- bf16, distributed optimizer on: the weights after the step equal the off case's (the same
  fp32 arithmetic on DP shards; a two-rank sum is the same in either collective).
- Every case: a step with a +inf loss on one rank is skipped on every rank (no weight moves), and
  the next step's warm-up learning rate is ``lr · 2 / warmup_steps``.
"""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.config.method import load_method
from tests.metric_bounds import assert_metrics_close
from tests.parallel.world import run_world

from . import workers_megatron_optimizer
from .hf_reference import CLIP, NO_CLIP, OPEFO, ROWS, hf_reference, save_hf_model
from .tiny import random_batch

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

CASES = [
    {"dtype": "float32", "distributed": False, "engine": CLIP},
    {"dtype": "float32", "distributed": True, "engine": CLIP},
    {"dtype": "bfloat16", "distributed": False, "engine": CLIP},
    {"dtype": "bfloat16", "distributed": True, "engine": CLIP},
    # grad_clip 0: megatron's clip_grad is inf, the norm is still returned, nothing is clipped
    {"dtype": "float32", "distributed": True, "engine": NO_CLIP},
]
CASES = [{**c, "micro_batch_size": 1, "method": OPEFO} for c in CASES]
IDS = [
    f"{c['dtype']}-{'distopt' if c['distributed'] else 'ddp'}-clip{c['engine']['grad_clip']}"
    for c in CASES
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``([result of each case], {grad_clip: HFPolicy's reference})``."""
    hf_dir = tmp_path_factory.mktemp("qwen2")
    save_hf_model("qwen2", hf_dir)
    folder = tmp_path_factory.mktemp("world")
    run_world(
        workers_megatron_optimizer.megatron_optimizer_updates,
        2,
        CASES,
        str(hf_dir),
        random_batch(ROWS, 100, low=1),
        str(folder),
    )
    results = [torch.load(folder / f"result_{i}.pt") for i in range(len(CASES))]
    references = {
        e["grad_clip"]: hf_reference(hf_dir, OPEFO, e, random_batch(ROWS, 100, low=1))
        for e in (CLIP, NO_CLIP)
    }
    return results, references


def _assert_common(got: dict, engine: dict) -> None:
    assert got["skipped"] == 0
    lr = load_method(*OPEFO).lr
    assert got["next_lr"] == pytest.approx(lr * min(1.0, 2 / engine["warmup_steps"]))


@pytest.mark.parametrize("index", [0, 1, 4], ids=[IDS[0], IDS[1], IDS[4]])
def test_fp32_equals_hf_policy(runs, index):
    results, references = runs
    engine = CASES[index]["engine"]
    got, want = results[index], references[engine["grad_clip"]]
    _assert_common(got, engine)
    valid = random_batch(ROWS, 100, low=1).response_mask  # what HFPolicy computes
    for field in ("logprob", "entropy"):
        torch.testing.assert_close(
            got["stats"][field][valid], getattr(want["stats"], field)[valid], rtol=1e-5, atol=1e-5
        )
    assert want["metrics"]["grad/norm"] > CLIP["grad_clip"]  # with clipping, it acts
    assert got["metrics"].keys() == want["metrics"].keys()
    assert_metrics_close(got["metrics"], want["metrics"], rel=1e-4)
    assert got["weights"].keys() == want["weights"].keys()
    # Adam's first step moves an element by lr_step · u(g), u(g) = g / (|g| + ε) (m̂ = g, v̂ = g²);
    # the gradient is known to the relative agreement of the two engines' metrics, so each weight
    # may move as far as u does over that gradient interval, plus the fp32 rounding of
    # w − step · u, four units of its terms (|w| + 2 · step bounds the start weight and the move)
    step = load_method(*OPEFO).lr / engine["warmup_steps"]
    (grads,) = want["grads"]  # one optimizer step, after clipping
    for name, weight in want["weights"].items():
        spread = _adam_first_step_spread(grads[name], engine["adam_eps"], rel=1e-4)
        allowed = step * spread + 2.0**-21 * (weight.abs() + 2 * step)
        excess = (got["weights"][name] - weight).abs() - allowed
        assert float(excess.max()) <= 0, (name, float(excess.max()), step)


def _adam_first_step_spread(grad: torch.Tensor, eps: float, rel: float) -> torch.Tensor:
    """``u(g + δ) − u(g − δ)`` for ``u(g) = g / (|g| + ε)`` (increasing in ``g``), ``δ`` being
    ``rel`` of the tensor's largest gradient: how far Adam's first step can move an element
    whose gradient is known to ``±δ`` (up to 2 where ``|g| ≲ δ``, a sign left to round-off)."""
    delta = rel * grad.abs().max()
    return (grad + delta) / ((grad + delta).abs() + eps) - (grad - delta) / (
        (grad - delta).abs() + eps
    )


def test_bf16_main_weights_equal_fp32_adamw(runs):
    results, references = runs
    got, want = results[2], references[CLIP["grad_clip"]]
    _assert_common(got, CLIP)
    grads = got["grads"]
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
    assert got["norm"] == pytest.approx(norm, rel=1e-5)
    assert got["metrics"]["grad/norm"] == pytest.approx(norm, rel=1e-5)
    assert norm == pytest.approx(want["metrics"]["grad/norm"], rel=0.1)

    method = load_method(*OPEFO)
    reference = {name: w.clone().requires_grad_() for name, w in got["start"].items()}
    for name, weight in got["start"].items():
        assert weight.dtype == torch.float32
        assert torch.equal(weight, weight.to(torch.bfloat16).float()), name  # bf16-rounded
    optimizer = torch.optim.AdamW(
        list(reference.values()),
        lr=method.lr / CLIP["warmup_steps"],
        betas=(0.9, 0.999),
        eps=CLIP["adam_eps"],
        weight_decay=0.0,
    )
    coefficient = min(1.0, CLIP["grad_clip"] / (norm + 1e-6))
    for name, weight in reference.items():
        weight.grad = grads[name] * coefficient
    optimizer.step()
    assert got["main"].keys() == reference.keys()
    for name, weight in reference.items():
        assert not torch.equal(weight.detach(), got["start"][name]), name  # it moved
        torch.testing.assert_close(
            got["main"][name], weight.detach(), rtol=1e-6, atol=1e-7, msg=lambda m, n=name: m + n
        )


def test_bf16_distributed_optimizer_equals_plain(runs):
    results, _ = runs
    plain, sharded = results[2], results[3]
    _assert_common(sharded, CLIP)
    assert sharded["metrics"]["grad/norm"] == pytest.approx(plain["metrics"]["grad/norm"], rel=1e-6)
    for name, weight in plain["weights"].items():
        assert weight.dtype == torch.bfloat16
        assert torch.equal(sharded["weights"][name], weight), name
