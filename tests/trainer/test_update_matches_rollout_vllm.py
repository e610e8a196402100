"""The trainer's token-stats pass sees exactly the policy and the tokens the vLLM rollout sampled.

spec §1: the rollout samples from ``softmax(z / T)``; both training phases must score the same
tokens under the same temperature-scaled policy. Checked on real vLLM completions of the
trainer's own prompts with the trainer's own sampling settings: the response mask of the built
batch selects exactly the returned token ids (the stop token, EOS, included: it was sampled, so
it is trained on; nothing after it), and the policy's log-probabilities at those positions equal
the ones vLLM reports for the sampled tokens.

Precision: the trainer starts vLLM in the engine's dtype (``engine.dtype``), so both sides run the
same weights and in fp32 agree to round-off. With vLLM's own default (``dtype="auto"`` runs an
fp32 model in bf16) an fp32 policy differed from the rollout by about 0.03 nat per token here.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from opefo_nemo.engines.batch import build_batch

pytestmark = pytest.mark.vllm

TEMPERATURE = 0.7
#: fp32 on both sides (the shared rollout runs in the default engine.dtype): the largest
#: |difference| relative to the largest |logprob| compared, whose round-off scales with it.
LOGPROB_REL = 1e-4


def masked_logprob_error(trainer, batch, completions) -> float:
    """The largest |trainer − vLLM| logprob of the sampled tokens over the largest |logprob|."""
    logprob = trainer.policy.token_stats(batch).logprob
    errors = [
        (logprob[row][batch.response_mask[row]] - torch.tensor(c.logprobs)).abs().max().item()
        for row, c in enumerate(completions)
    ]
    scale = max(max(abs(x) for x in c.logprobs) for c in completions)
    return max(errors) / scale


def test_token_stats_pass_scores_the_rollouts_tokens_under_its_temperature(make_trainer):
    trainer = make_trainer([f"rollout.temperature={TEMPERATURE}"])
    assert next(trainer.policy.model.parameters()).dtype == torch.float32
    prompts = trainer.train.prompts[:4]
    sampling = trainer._sampling(0)
    completions = trainer.rollout.generate(prompts, 3, sampling)
    truncated = trainer.rollout.generate(prompts, 2, replace(sampling, max_new_tokens=2))
    completions = completions + [c for c in truncated if c.finish_reason == "length"]
    eos = trainer.codec.eos_id
    assert {c.finish_reason for c in completions} == {"stop", "length"}, "need both endings"

    batch = build_batch(
        [prompts[c.prompt_index] for c in completions],
        [c.token_ids for c in completions],
        torch.zeros(len(completions)),
        trainer.codec.pad_id,
    )
    for row, c in enumerate(completions):
        trained = batch.targets[row][batch.response_mask[row]].tolist()
        assert trained == c.token_ids
        assert (trained[-1] == eos) == (c.finish_reason == "stop")
        assert eos not in trained[:-1]

    assert trainer.policy.temperature == TEMPERATURE
    assert masked_logprob_error(trainer, batch, completions) < LOGPROB_REL
    trainer.policy.temperature = 1.0  # the test can fail: the unscaled policy is another one
    assert masked_logprob_error(trainer, batch, completions) > 10 * LOGPROB_REL
