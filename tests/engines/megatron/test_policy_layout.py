"""``MegatronPolicy`` takes the same step whatever the micro-batch layout: which rows form each
micro-batch, each at its own width, and which data-parallel rank runs it.

A tiny Qwen2 (random weights) on gloo CPU ranks, built by ``engine=megatron``'s own builder
(megatron's DDP and optimizer, fp32), one fresh policy per layout. Each layout's
``token_stats`` of the whole batch (rows of 3 to 19 tokens), the entropy gradient
(``capture_entropy_gradient``) and one optimizer step (a policy-gradient loss with an entropy
bonus, clipping acting) are compared with the engine's contiguous layout (equal contiguous blocks
of two rows, today's rule):

- DP 2 × TP 2 with sequence parallelism (widths rounded up to 2): micro-batches of the rows sorted
  by length, not consecutive, rank 0 running one and rank 1 two;
- PP 2: micro-batches of 2, 1, 3 and 2 rows of four different widths, so the pipelined schedule
  exchanges each activation's shape (``variable_seq_lengths``);
- DP 2 alone: that uneven layout, and every micro-batch on rank 0 (rank 1 runs nothing; with
  ``engine.overlap_grad_reduce`` a zero-weighted stand-in).

Equal up to fp32 round-off (each row's forward runs in batches of other shapes, the gradient is
accumulated in another order): the statistics of every predicted token, ``⟨g, g⟩``, the gradient
norm, the two metric sums, the clipped gradient of every weight; the weights after the step
within what AdamW's first step makes of those gradients (:func:`assert_adam_first_step_close`).
The two-rank world also checks that the policy refuses a model that is not its layout's.
"""

from __future__ import annotations

import pytest
import torch

from tests.metric_bounds import (
    assert_adam_first_step_close,
    assert_close_to_scale,
    assert_grads_close,
)
from tests.parallel.world import run_world

from . import workers_layout
from .hf_reference import CLIP, save_hf_model
from .tiny import random_batch

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

ROWS, VOCAB = 8, 100
#: Lengths 19, 3, 5, 17, 14, 16, 5, 19 tokens (prompt + response).
BATCH = {"rows": ROWS, "vocab": VOCAB, "seed": 5, "low": 1, "longest_response": 16}
#: The reference is the contiguous layout (its statistics pass planned by the engine).
ENGINE = {
    **CLIP,
    "micro_batch_size": 2,
    "use_distributed_optimizer": False,
    "batch_layout": "contiguous",
}
CONTIGUOUS = {"rows": None, "owners": None}
#: The rows sorted by length in micro-batches of 2, 3 and 3 rows; rank 0 runs the first.
UNEVEN = {"rows": [[0, 7], [3, 5, 4], [2, 6, 1]], "owners": [0, 1, 1]}
ONE_RANK = {"rows": [[0, 7, 3], [5, 4], [2, 6, 1]], "owners": [0, 0, 0]}
#: Four shapes [rows, width]: [2, 19], [1, 17], [3, 16], [2, 5].
PIPELINE = {"rows": [[0, 7], [3], [5, 4, 2], [6, 1]], "owners": [0, 0, 0, 0]}

WORLDS = {
    4: [
        {
            "engine": {**ENGINE, "tensor_model_parallel_size": 2, "sequence_parallel": True},
            "layouts": {"contiguous": CONTIGUOUS, "uneven": UNEVEN},
        }
    ],
    2: [
        {
            "engine": {**ENGINE, "pipeline_model_parallel_size": 2},
            "layouts": {"contiguous": CONTIGUOUS, "variable": PIPELINE},
        },
        {
            "engine": ENGINE,
            "layouts": {
                "contiguous": CONTIGUOUS,
                "uneven": UNEVEN,
                "one_rank": ONE_RANK,
                "one_rank_overlap": {**ONE_RANK, "engine": {"overlap_grad_reduce": True}},
            },
        },
    ],
}
#: fp32 round-off of one row's forward in batches of other shapes and of the gradient
#: accumulated in another order, relative to the largest magnitude of each tensor (statistics,
#: gradients) or to the value (norms): at most 1.04e-6 seen (on megatron-core 0.16.1 and 0.11
#: alike), bound ~10× that.
STATS_REL = 1e-5
#: The metric sums (float64 over fp32 per-micro-batch sums) relative to ``Σ|terms|``: at most
#: 7.4e-8 seen, bound ~13× that.
SUMS_REL = 1e-6
CASES = [
    ("dp2-tp2-sp", 4, 0, "uneven"),
    ("pp2", 2, 0, "variable"),
    ("dp2", 2, 1, "uneven"),
    ("dp2-one-rank", 2, 1, "one_rank"),
    ("dp2-one-rank-overlap", 2, 1, "one_rank_overlap"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{(world size, case index): {layout name: result}}``, one spawned world per size (the
    two-rank world last, which also saves ``check_model``'s refusals)."""
    hf_dir = tmp_path_factory.mktemp("qwen2")
    save_hf_model("qwen2", hf_dir)
    out = {}
    for world, cases in WORLDS.items():
        folder = tmp_path_factory.mktemp(f"world{world}")
        batch = random_batch(**BATCH)
        run_world(workers_layout.layout_steps, world, str(hf_dir), cases, batch, str(folder))
        for index in range(len(cases)):
            out[(world, index)] = torch.load(folder / f"case_{index}.pt")
    out["refusals"] = torch.load(folder / "refusals.pt")  # the two-rank world's
    return out


@pytest.mark.parametrize(
    ("world", "index", "name"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_layout_takes_the_contiguous_layouts_step(runs, world, index, name):
    results = runs[(world, index)]
    got, want = results[name], results["contiguous"]
    batch = random_batch(**BATCH)
    valid = batch.attention_mask[:, 1:]  # every predicted token (padding excluded)
    for field, theirs in want["stats"].items():
        ours = got["stats"][field]
        assert ours.shape == theirs.shape == valid.shape, field
        assert_close_to_scale(ours[valid], theirs[valid], STATS_REL, field)

    assert not got["skipped"] and not want["skipped"]
    assert want["grad_norm"] > ENGINE["grad_clip"]  # clipping acts
    for key in ("grad_norm", "entropy_grad_squared"):  # sums of squares: their own scale
        assert got[key] == pytest.approx(want[key], rel=STATS_REL, abs=0), key
    mask = batch.response_mask
    for key, value in want["sums"].items():  # Σ mask·x over the tokens: terms Σ mask·|x|
        terms = float((want["stats"][key].double().abs() * mask).sum())
        assert got["sums"][key] == pytest.approx(value, rel=0, abs=SUMS_REL * terms), key
    assert_grads_close(got["grads"], want["grads"], rel=STATS_REL)
    assert_adam_first_step_close(
        got["weights"],
        want["weights"],
        got["grads"],
        want["grads"],
        lr=workers_layout.LR / CLIP["warmup_steps"],
        eps=CLIP["adam_eps"],
    )


def test_a_model_that_is_not_the_layouts_is_refused(runs):
    """``MegatronPolicy`` checks its model (``model_checks.check_model``): the TP size, the weight
    names, their shard shapes and the dtype, each named in the error."""
    tp, names, shape, dtype = runs["refusals"]
    assert tp == "parallel_state has tensor parallel 1, the layout 2"
    assert "do not match the layout: missing []" in names and "linear_qkv.bias" in names
    assert "embedding.word_embeddings.weight has shape (104, 32)" in shape and "112" in shape
    assert dtype.endswith("is not engine.dtype=bfloat16")
