"""Pipeline parallelism (PP > 1) through megatron-core 0.16.1's real 1F1B schedule on CPU.

A real ``GPTModel`` (Llama-like, 3 layers split 1 | 2 over two stages, GQA, padded vocabulary
100 → 112, T = 0.7) runs the token-stats pass (forward only) and the OPEFO loss pass through
``get_forward_backward_func()`` over gloo, with the p2p sends and receives as shipped (only the
CUDA allocations redirected by ``cpu_megatron``). Against a single-process TP 1 / PP 1 reference
that uses none of ``token_stats``, the closure or the schedule: (a) the statistics every stage
holds after the broadcast (logprob, entropy and the two tabular sums) equal the reference's
full-vocabulary ``log_softmax`` statistics; (b) each stage's gradients (TP-gathered, layer offset
mapped) equal the reference's; (c) the stats pass's logprobs equal the loss pass's. PP 2 with
micro-batch size 1 and 2 (5 rows: the last micro-batch padded), PP 3 (a middle stage that reads
no data) with 2, TP 2 × PP 2 with 2. Plus single-process checks of the micro-batch padding and
keys."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.core.objectives import Coefficients
from opefo_nemo.engines.megatron.pipeline_batch import (
    FIRST_STAGE_KEYS,
    LOSS_KEYS,
    STATS_KEYS,
    STATS_NAMES,
    TABULAR_NAMES,
    PipelineMicroBatches,
    item_loss_function,
    stage_keys,
)
from tests.parallel.world import run_world

from . import workers_pipeline
from .tiny import random_batch

pytest.importorskip("megatron.core")
ROWS = 5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    batch = random_batch(ROWS, workers_pipeline.VOCAB)
    folder = tmp_path_factory.mktemp("reference")
    run_world(workers_pipeline.reference_step, 1, batch, str(folder))
    return batch, torch.load(folder / "reference.pt")


@pytest.mark.parametrize(
    ("tp", "pp", "micro_batch_sizes"), [(1, 2, [1, 2]), (1, 3, [2]), (2, 2, [2])]
)
def test_pipeline_equals_single_process_reference(reference, tmp_path, tp, pp, micro_batch_sizes):
    batch, want = reference
    run_world(
        workers_pipeline.pipeline_step,
        tp * pp,
        tp,
        pp,
        micro_batch_sizes,
        batch,
        want["state"],
        str(tmp_path),
    )
    real = batch.attention_mask[:, 1:]
    for mbs in micro_batch_sizes:
        ranks = [torch.load(tmp_path / f"mbs{mbs}_rank{r}.pt") for r in range(tp * pp)]
        assert sorted({r["stage"] for r in ranks}) == list(range(pp))
        last = [r for r in ranks if r["last"]]
        for got in ranks:
            where = f"mbs {mbs}, stage {got['stage']}"
            expected_keys = set(stage_keys(got["first"], got["last"], loss=False)) | set(
                stage_keys(got["first"], got["last"], loss=True)
            )
            assert {k for keys in got["keys"] for k in keys} == expected_keys, where
            # both passes took every micro-batch's item, on every stage
            assert len(got["keys"]) == 2 * got["num_microbatches"] == 2 * -(-ROWS // mbs), where
            assert got["n_tokens"] == want["n_tokens"] == batch.n_response_tokens, where
            assert got["lambda_star"] == pytest.approx(want["lambda_star"], rel=1e-5), where
            stats = got["stats"]
            assert stats.keys() == set(STATS_NAMES + TABULAR_NAMES), where
            assert sorted(stats["logprob"]) == list(range(ROWS)), where
            for row in range(ROWS):
                width = stats["logprob"][row].shape[0]
                keep = real[row, :width]
                assert not real[row, width:].any(), where
                for name, values in stats.items():
                    # (a) every stage's broadcast statistics = the reference's, and exactly the
                    # last stage's
                    torch.testing.assert_close(
                        values[row][keep], want[name][row, :width][keep], rtol=1e-5, atol=1e-5
                    )
                    assert torch.equal(values[row], last[0]["stats"][name][row]), where
                if got["last"]:
                    # (c) the stats pass's logprobs = the loss pass's
                    loss_pass = got["loss_logprob"][row][keep]
                    assert torch.equal(loss_pass, stats["logprob"][row][keep]), where

        # (b) per stage, TP-gathered gradients under full-model names = the reference's
        grads = {}
        for got in ranks:
            grads.update(got["grads"])
        assert grads.keys() == want["grads"].keys()
        for name, grad in want["grads"].items():
            assert grad.abs().max() > 0, name
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def _micro_plan(micro_batch_size: int = 2) -> tuple:
    batch = random_batch(ROWS, workers_pipeline.VOCAB)
    return batch, PipelineMicroBatches.split(batch, micro_batch_size, seq_multiple=4)


def _corner(rows: int, cols: int, shape: tuple[int, int], inside, outside) -> torch.Tensor:
    """``inside`` in the top-left ``[rows, cols]`` of a ``shape`` tensor of ``outside``."""
    out = torch.full(shape, outside)
    out[:rows, :cols] = inside
    return out


def test_items_padded_to_the_schedule_shape_with_keys_per_stage():
    batch, plan = _micro_plan()
    width = batch.input_ids.shape[1]
    assert plan.num_microbatches == 3 and plan.padded_rows == 6
    assert plan.seq_length % 4 == 0 and width <= plan.seq_length < width + 4
    shape = (2, plan.seq_length)
    assert plan.stats_items(first=False, last=False) == [{}] * 3
    assert all(tuple(i) == FIRST_STAGE_KEYS for i in plan.stats_items(first=True, last=False))
    assert all(tuple(i) == STATS_KEYS for i in plan.stats_items(first=False, last=True))
    assert stage_keys(False, False, loss=True) == ()
    assert set(stage_keys(True, True, loss=True)) == set(FIRST_STAGE_KEYS + LOSS_KEYS)

    coefficients = [
        Coefficients(
            delta_h=torch.full(m.targets.shape, -3.0),
            weight=torch.full(m.targets.shape, 2.0),
            selected=torch.ones(m.targets.shape, dtype=torch.bool),
        )
        for m in plan.micros
    ]
    old = [torch.full(m.targets.shape, -5.0) for m in plan.micros]
    items = plan.loss_items(coefficients, 17, first=True, last=True, old_logprob=old)
    for micro, item in zip(plan.micros, items, strict=True):
        assert set(item) == set(FIRST_STAGE_KEYS + LOSS_KEYS + ("old_logprob",))
        rows, cols = micro.input_ids.shape
        assert torch.equal(item["input_ids"], _corner(rows, cols, shape, micro.input_ids, 0))
        assert torch.equal(item["position_ids"], torch.arange(shape[1]).expand(shape))
        per_token = rows, cols - 1
        assert torch.equal(item["targets"], _corner(*per_token, shape, micro.targets, 0))
        assert torch.equal(item["mask"], _corner(*per_token, shape, micro.response_mask, False))
        assert torch.equal(item["advantages"], _corner(*per_token, shape, micro.advantages, 0.0))
        # padding: ΔH 0, weight 1, nothing selected, old logprob 0, masked out
        assert torch.equal(item["delta_h"], _corner(*per_token, shape, -3.0, 0.0))
        assert torch.equal(item["weight"], _corner(*per_token, shape, 2.0, 1.0))
        assert torch.equal(item["selected"], _corner(*per_token, shape, True, False))
        assert torch.equal(item["old_logprob"], _corner(*per_token, shape, -5.0, 0.0))
        assert item["n_tokens"].dtype == torch.int64 and int(item["n_tokens"]) == 17

    with pytest.raises(ValueError, match="2 coefficient chunks for 3 micro-batches"):
        plan.loss_items(coefficients[:2], 17, first=True, last=True)
    with pytest.raises(KeyError, match="lacks"):
        item_loss_function(None, plan.stats_items(first=False, last=True)[0], None, None)


def test_unpad_gather_and_chunks_invert_the_padding():
    batch, plan = _micro_plan()
    stacked = torch.randn(plan.padded_rows, plan.seq_length)
    outputs = [{"logprob": part, "entropy": -part} for part in stacked.split(plan.micro_batch_size)]
    stats = plan.gather_stats(outputs, None)
    assert torch.equal(stats["logprob"], stacked) and torch.equal(stats["entropy"], -stacked)
    chunks = plan.token_chunks(stats)
    first = 0
    for i, (micro, chunk) in enumerate(zip(plan.micros, chunks, strict=True)):
        rows, cols = micro.targets.shape
        assert torch.equal(chunk.logprob, stacked[2 * i : 2 * i + rows, :cols])
        assert torch.equal(chunk.entropy, -chunk.logprob)
        assert torch.equal(chunk.mask, batch.response_mask[first : first + rows, :cols])
        assert torch.equal(chunk.token_ids, batch.token_ids[first : first + rows, :cols])
        first += rows
    assert first == batch.rows

    with pytest.raises(ValueError, match="2 stats outputs for 3 micro-batches"):
        plan.gather_stats(outputs[:2], None)
    with pytest.raises(ValueError, match="unpad expects"):
        plan.unpad(stacked[:, :-1])
