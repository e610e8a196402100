"""``MegatronPolicy`` against ``HFPolicy`` on the same weights and rollout batch.

A tiny Hugging Face Qwen2 (rope, QKV bias, 4 query / 2 key-value heads; untied or tied embeddings;
random weights) or Qwen3 (q/k norms) is converted with ``hf_to_megatron`` and loaded strictly into
a real megatron-core ``GPTModel`` on every spawned gloo rank; the trainer's own
``update_rollout_batch`` (phases 1–3, OPEFO or multi-update Entropy-Reg) then runs on
``MegatronPolicy`` through megatron's real schedules at TP 1, TP 2, DP 2, TP 2 × DP 2, PP 2 (tied
and untied) and TP 2 × PP 2, with 1 to 3 responses per micro-batch, and on ``HFPolicy`` with the
whole batch as one micro-batch. Equal: the whole batch's token statistics (vocabulary sums too),
every metric of the update (loss, flow, λ*, ``grad/norm``, ``lr``), the clipped gradient of every
weight at each optimizer step (Hugging Face names), every weight after the step (fp32); the loss
pass's logprobs equal the stats pass's; the warm-up lr of the next step; ``save`` / ``load``
resumes exactly; a step with a +inf loss on one rank is skipped on every rank.

``MegatronPolicy`` is built the production way: the model in megatron's
``DistributedDataParallel`` with megatron's optimizer (``wrap_for_training``; fp32, distributed
optimizer off, megatron's fallback ``torch.optim.AdamW``); the gradients are the reduced
``main_grad`` buffers at megatron's optimizer step, scaled by its clipping coefficient.
"""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.config.method import load_method
from tests.metric_bounds import assert_grads_close, assert_metrics_close
from tests.parallel.world import run_world

from . import workers_policy
from .hf_reference import CLIP, NO_CLIP, OPEFO, ROWS, hf_reference, save_hf_model
from .tiny import random_batch

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

#: Two optimizer steps of two responses each: old logprobs, ratio clipping, entropy gradient.
ENTROPY_REG = ("entropy_reg", ["lr=1e-3", "updates_per_rollout=2"])


#: Per world size: the cases its ranks run one after the other (DP = world size / (TP × PP)).
WORLDS = {
    2: [
        {"family": "qwen2", "tp": 2, "micro_batch_size": 2, "method": OPEFO, "engine": CLIP},
        {
            "family": "qwen2",
            "tp": 1,
            "micro_batch_size": 1,
            "method": ENTROPY_REG,
            "engine": NO_CLIP,
        },
        # PP 2: micro-batches of 3 and 1 responses, the second padded to the schedule's shape
        {
            "family": "qwen2",
            "tp": 1,
            "pp": 2,
            "micro_batch_size": 3,
            "method": OPEFO,
            "engine": CLIP,
        },
        # PP 2, tied: the embedding's gradient summed over the first and last stage
        {
            "family": "qwen2_tied",
            "tp": 1,
            "pp": 2,
            "micro_batch_size": 2,
            "method": OPEFO,
            "engine": CLIP,
        },
    ],
    4: [
        {"family": "qwen2_tied", "tp": 2, "micro_batch_size": 1, "method": OPEFO, "engine": CLIP},
        # TP 2 × PP 2: vocab-parallel statistics on the last stage of a two-stage pipeline
        {
            "family": "qwen2",
            "tp": 2,
            "pp": 2,
            "micro_batch_size": 2,
            "method": OPEFO,
            "engine": CLIP,
        },
    ],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{(world size, case index): (case, HF model directory, result folder)}``."""
    hf_dirs = {}
    for family in ("qwen2", "qwen2_tied"):
        hf_dirs[family] = tmp_path_factory.mktemp(family)
        save_hf_model(family, hf_dirs[family])
    out = {}
    for world, cases in WORLDS.items():
        folder = tmp_path_factory.mktemp(f"world{world}")
        dirs = {family: str(path) for family, path in hf_dirs.items()}
        run_world(
            workers_policy.policy_updates,
            world,
            cases,
            dirs,
            random_batch(ROWS, 100, low=1),
            str(folder),
        )
        for index, case in enumerate(cases):
            out[(world, index)] = (case, hf_dirs[case["family"]], folder / f"result_{index}.pt")
    return out


@pytest.mark.parametrize(
    ("world", "index"),
    [(world, index) for world, cases in WORLDS.items() for index in range(len(cases))],
    ids=lambda v: str(v),
)
def test_megatron_policy_equals_hf_policy(runs, world, index):
    case, hf_dir, result = runs[(world, index)]
    method, engine = case["method"], case["engine"]
    batch = random_batch(ROWS, 100, low=1)
    want = hf_reference(hf_dir, method, engine, batch)
    got = torch.load(result)

    valid = batch.response_mask  # HFPolicy computes response columns only (prompts hold 0)
    for field in workers_policy.STAT_FIELDS:
        ours, theirs = got["stats"][field], getattr(want["stats"], field)
        assert ours.shape == theirs.shape == valid.shape, field
        torch.testing.assert_close(
            ours[valid],
            theirs[valid],
            rtol=1e-5,
            atol=1e-5,
            msg=lambda m, field=field: f"{field}: {m}",
        )

    assert got["skipped"] == 0
    assert got["metrics"].keys() == want["metrics"].keys()
    assert_metrics_close(got["metrics"], want["metrics"], rel=1e-4)
    if engine["grad_clip"] > 0:
        assert want["metrics"]["grad/norm"] > engine["grad_clip"]

    assert len(got["grads"]) == len(want["grads"]) == load_method(*method).updates_per_rollout
    for ours, theirs in zip(got["grads"], want["grads"], strict=True):
        # fp32 round-off of two different reduction orders, relative to each tensor's terms
        assert_grads_close(ours, theirs, rel=1e-4)
    assert got["weights"].keys() == want["weights"].keys()
    for name, weight in want["weights"].items():
        torch.testing.assert_close(
            got["weights"][name],
            weight,
            rtol=1e-5,
            atol=1e-6,
            msg=lambda m, name=name: f"{name}: {m}",
        )

    assert got["resumed"] is True
    lr = load_method(*method).lr
    assert got["second_lr"] == pytest.approx(lr * min(1.0, 2 / engine["warmup_steps"]))
