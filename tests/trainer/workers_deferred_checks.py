"""A pass whose checks fail in one micro-batch, for either engine: where the error is raised,
what it says, and that a loss pass with non-finite logits skips its step."""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core.objectives import LossOutput
from opefo_nemo.engines.batch import TrainBatch, build_batch
from opefo_nemo.parallel import NonFiniteLogitsError
from tests.trainer.workers_host_syncs import MICRO_BATCH_SIZE

POISON_ROW = 2  # in the second micro-batch of MICRO_BATCH_SIZE = 2


def batch_with(token: int) -> TrainBatch:
    """Four responses of ordinary tokens; row :data:`POISON_ROW`'s response has ``token``."""
    prompts = [[5, 6, 7]] * 4
    responses = [[8, 9, 10, 11]] * 4
    responses[POISON_ROW] = [8, token, 10, 11]
    return build_batch(prompts, responses, torch.tensor([1.0, -1.0, 0.5, -0.5]), pad_id=0)


def nan_embedding_row(embedding: torch.Tensor, token: int) -> None:
    with torch.no_grad():
        embedding[token].fill_(float("nan"))


def check_nonfinite_logits(policy, token: int) -> None:
    """``token``'s embedding row is NaN: the stats pass raises once, naming the micro-batch;
    the loss pass skips the step and leaves the weights as they were."""
    whole = batch_with(token)
    with pytest.raises(NonFiniteLogitsError, match=r"\(micro-batch 1 of the token-stats pass\)$"):
        policy.token_stats(whole)
    before = [w.clone() for _, w in policy.named_weights()]
    result = policy.train_step(
        whole.split(MICRO_BATCH_SIZE), lambda i, stats: LossOutput(-stats.logprob.sum(), {}), ()
    )
    assert result.skipped and math.isnan(result.grad_norm)
    for old, new in zip(before, (w for _, w in policy.named_weights()), strict=True):
        torch.testing.assert_close(new, old, rtol=0, atol=0, equal_nan=True)


def check_target_outside_vocabulary(policy, vocab: int) -> None:
    """A target in the padded vocabulary's padding: both passes raise token_stats's error once,
    after the pass, naming the micro-batch."""
    whole = batch_with(vocab)
    message = rf"target id {vocab} at flat position \d+ is outside the vocabulary \[0, {vocab}\)"
    with pytest.raises(ValueError, match=message + r".*\(micro-batch 1 of the token-stats pass\)"):
        policy.token_stats(whole)
    with pytest.raises(ValueError, match=message + r".*\(micro-batch 1 of the loss pass\)"):
        policy.train_step(
            whole.split(MICRO_BATCH_SIZE), lambda i, s: LossOutput(-s.logprob.sum(), {}), ()
        )


def megatron_rank(rank: int, world: int, model_dir: str, vocab: int) -> None:
    from opefo_nemo.config.engines import MegatronEngineConfig
    from opefo_nemo.engines.megatron.build import build_megatron_policy
    from opefo_nemo.engines.megatron.fused_output import gpt_model

    engine = MegatronEngineConfig(
        device="cpu", micro_batch_size=MICRO_BATCH_SIZE, make_vocab_size_divisible_by=8
    )
    policy = build_megatron_policy(model_dir, engine, lr=1e-3, temperature=1.0)
    assert policy.layout.padded_vocab_size > vocab  # a padding row exists
    check_target_outside_vocabulary(policy, vocab)
    nan_embedding_row(gpt_model(policy.model).embedding.word_embeddings.weight, 2)
    check_nonfinite_logits(policy, 2)
