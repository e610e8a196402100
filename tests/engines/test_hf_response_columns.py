"""The ``hf`` engine's output layer and token statistics over the response columns only
(``TrainBatch.first_response_column`` on): the statistics and gradients of the full logits at
every response token, 0 in the prompt columns, and the output layer run on the kept columns
alone (docs/performance.md, "A real model's step beside TRL")."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core.objectives.loss import LossOutput
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.parallel import token_stats
from tests.metric_bounds import U32

ENGINE = EngineConfig(warmup_steps=0, micro_batch_size=8, grad_clip=0.0)
TEMPERATURE = 0.7
PREFIX = 9  # a shared chat-template-like prefix: the columns before it are prompt in every row


def chat_batch(rows: int, seed: int):
    """Prompts of a shared prefix and 0–3 own tokens, responses of 2–6 tokens, signed
    advantages."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, 60, (PREFIX,), generator=gen).tolist()
    prompts = [prefix + torch.randint(3, 60, (n % 4,), generator=gen).tolist() for n in range(rows)]
    responses = [torch.randint(3, 60, (2 + n % 5,), generator=gen).tolist() for n in range(rows)]
    return build_batch(prompts, responses, torch.randn(rows, generator=gen), pad_id=0)


def test_the_first_response_column_is_the_shortest_prompts_last_position():
    batch = chat_batch(7, seed=0)
    prompt_lengths = [
        int(batch.attention_mask[r].sum()) - int(batch.response_mask[r].sum()) for r in range(7)
    ]
    assert batch.first_response_column == min(prompt_lengths) - 1 == PREFIX - 1
    later = batch.select([1, 2, 3])  # prompts of 1, 2 and 3 own tokens
    assert later.first_response_column == PREFIX


def loss_and_entropy(micro_batches):
    """``Σ A·logprob + Σ H`` over each micro-batch's response tokens, as a ``LossFn``."""

    def loss_fn(index, stats):
        micro = micro_batches[index]
        mask = micro.response_mask
        terms = (micro.advantages * stats.logprob)[mask].sum() + stats.entropy[mask].sum()
        return LossOutput(loss=terms, sums={})

    return loss_fn


def test_statistics_are_the_full_logits_at_every_response_token(tiny_model_dir):
    """Against ``token_stats`` of every column's logits from the same weights: the hidden states
    are the same computation, the output layer's product of ``d`` terms may sum in another order
    (``|Δz| ≤ 2·d·u₃₂·S``, ``S = max_a Σ_i |h_i W_ai|``), and a logprob of ``softmax(z / T)``
    moves by at most twice a logit's change over ``T``. The prompt columns hold 0."""
    policy = HFPolicy(tiny_model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    batch = chat_batch(6, seed=1)
    first = batch.first_response_column
    seen = []
    output_layer = policy.model.get_output_embeddings()
    hook = output_layer.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    try:
        got = policy.token_stats(batch, sums=("sum_p2",))
    finally:
        hook.remove()
    width = batch.input_ids.shape[1]
    assert first > 0 and seen == [width - first]  # the output layer saw the kept columns only

    with torch.no_grad():
        out = policy.model(
            batch.input_ids, attention_mask=batch.attention_mask.long(), output_hidden_states=True
        )
        want = token_stats(
            out.logits[:, :-1], batch.targets, temperature=TEMPERATURE, sums=("sum_p2",)
        )
        weight = output_layer.weight
        terms = (out.hidden_states[-1].abs() @ weight.abs().T).amax(dim=-1)[:, :-1]
    mask = batch.response_mask
    dz = 2 * weight.shape[1] * U32 * terms[mask].double()
    logprob_bound = 2 * dz / TEMPERATURE
    assert bool(((got.logprob - want.logprob)[mask].abs() <= logprob_bound).all())
    entropy_bound = logprob_bound * (1 + want.entropy[mask].double())  # H = −Σ p log p
    assert bool(((got.entropy - want.entropy)[mask].abs() <= entropy_bound).all())
    assert bool(((got.sum_p2 - want.sum_p2)[mask].abs() <= logprob_bound).all())  # Σp² ≤ 1
    for name, value in got.present().items():
        assert not value[:, :first].any(), name


@pytest.mark.parametrize("shared", [False, True], ids=["separate", "shared_forward"])
def test_gradients_are_the_full_logits(tiny_model_dir, shared):
    """The step's gradient through the kept columns against the loss of every column's logits,
    backpropagated through the same weights: sums of the same ``n`` per-token terms of at most
    ``K`` products each in other orders, within ``2·(n + K)·u₃₂`` of each tensor's largest
    gradient (seen: equal to the last bit on an AMD EPYC)."""
    engine = dataclasses.replace(ENGINE, shared_forward=shared)
    policy = HFPolicy(tiny_model_dir, engine, lr=1e-3, temperature=TEMPERATURE)
    micro = chat_batch(8, seed=2).split(4)
    kept = policy.forward_with_graph(micro) if shared else None
    captured = policy.capture_entropy_gradient(micro, loss_and_entropy(micro), kept)
    assert captured is not None

    model = policy.model
    model.zero_grad(set_to_none=True)
    for index, batch in enumerate(micro):
        logits = model(batch.input_ids, attention_mask=batch.attention_mask.long()).logits
        stats = token_stats(logits[:, :-1], batch.targets, temperature=TEMPERATURE)
        loss_and_entropy(micro)(index, stats).loss.backward()
    want = [p.grad for p in model.parameters()]
    n = sum(b.n_response_tokens for b in micro)
    k = max(model.config.intermediate_size, model.config.vocab_size)
    for got, ref in zip(captured.grads, want, strict=True):
        bound = 2 * (n + k) * U32 * float(ref.abs().max())
        assert float((got - ref).abs().max()) <= bound
        assert float(ref.abs().max()) > 0
