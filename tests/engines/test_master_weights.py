"""``engine.dtype=bfloat16`` in the ``hf`` engine: bf16 compute parameters beside fp32 master
weights (``engines/master_weights.py``). References: a second bf16 copy of the model whose
per-micro-batch gradients are summed in float64, torch's fp32 AdamW on the masters, and exact
equality where nothing is rounded differently (docs/training.md, "Precision")."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core.objectives.loss import LossOutput
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import MODEL_SUBDIR, HFPolicy
from opefo_nemo.engines.hf_generation import HFGenerator
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.models.transformers_compat import load_causal_lm
from opefo_nemo.parallel import token_stats
from opefo_nemo.rollout.types import SamplingConfig
from tests.metric_bounds import U32

MIXED = EngineConfig(dtype="bfloat16", grad_clip=0.0, warmup_steps=0, micro_batch_size=2)
TEMPERATURE = 0.7
LR = 1e-3
U_BF16 = 2.0**-8
#: bf16 units of a logit's terms by which the sampler's and the trainer's logit may differ: one
#: rounding of the output layer's product plus what the layers before pass on; 0.31 units seen
#: on the tiny model at 1 and 2 threads, so 2 is a 6× margin.
BF16_UNITS = 2.0


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory):
    """A tiny Qwen2 with tied embeddings (one master for two uses of a weight)."""
    spec = TinyModelSpec(initializer_range=0.1, tie_word_embeddings=True)
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", spec, seed=0)


def random_batch(rows: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 60, (int(n),), generator=gen).tolist() for n in range(3, 3 + rows)]
    responses = [torch.randint(3, 60, (5 + n % 3,), generator=gen).tolist() for n in range(rows)]
    return build_batch(prompts, responses, torch.randn(rows, generator=gen), pad_id=0)


def pg_loss(micro_batches):
    """``Σ A·logprob`` over each micro-batch's response tokens, as a ``LossFn``."""

    def loss_fn(index, stats):
        micro = micro_batches[index]
        terms = (micro.advantages * stats.logprob)[micro.response_mask]
        return LossOutput(loss=terms.sum(), sums={})

    return loss_fn


def test_the_model_computes_in_bf16_from_fp32_masters_read_from_the_checkpoint(tied_model):
    policy = HFPolicy(tied_model, MIXED, lr=LR, temperature=TEMPERATURE)
    reference = load_causal_lm(tied_model, torch.float32)
    want = [p.detach() for p in reference.parameters()]
    assert all(m.dtype == torch.float32 for m in policy.weights.masters)
    assert all(p.dtype == torch.bfloat16 for p in policy.model.parameters())
    assert len(policy.weights.masters) == len(want)  # the tied weight once
    pairs = zip(policy.weights.masters, policy.weights.params, strict=True)
    for (master, param), value in zip(pairs, want, strict=True):
        assert torch.equal(master, value) and torch.equal(param, value.to(torch.bfloat16))
    assert policy.optimizer.param_groups[0]["params"] == policy.weights.masters


def test_micro_batch_gradients_add_up_in_fp32(tied_model):
    """The captured gradient is the float64 sum of the bf16 model's per-micro-batch gradients up
    to fp32 summation (``(n − 1)·u₃₂·Σ|g_i|`` per element); a bf16 sum would miss that bound."""
    policy = HFPolicy(tied_model, MIXED, lr=LR, temperature=TEMPERATURE)
    micro = random_batch(8, seed=1).split(2)
    captured = policy.capture_entropy_gradient(micro, pg_loss(micro))
    assert captured is not None

    reference = load_causal_lm(tied_model, torch.float32).to(torch.bfloat16).train()
    per_micro = []
    for index, batch in enumerate(micro):
        reference.zero_grad(set_to_none=True)
        mask = batch.attention_mask.long()
        logits = reference(input_ids=batch.input_ids, attention_mask=mask).logits[:, :-1]
        stats = token_stats(logits, batch.input_ids[:, 1:], temperature=TEMPERATURE)
        pg_loss(micro)(index, stats).loss.backward()
        per_micro.append([p.grad.clone() for p in reference.parameters()])
    by_param = list(zip(*per_micro, strict=True))
    exact = [torch.stack([g.double() for g in grads]).sum(0) for grads in by_param]
    bound = [
        (len(micro) - 1) * U32 * torch.stack([g.double().abs() for g in grads]).sum(0)
        for grads in by_param
    ]
    bf16_sum = [sum(grads[1:], grads[0]) for grads in by_param]  # summed in bf16
    for got, ref, b in zip(captured.grads, exact, bound, strict=True):
        assert got.dtype == torch.float32
        assert bool(((got.double() - ref).abs() <= b).all())
    triples = zip(bf16_sum, exact, bound, strict=True)
    # the bound tells fp32 accumulation from bf16's
    assert any(bool(((s.double() - r).abs() > b).any()) for s, r, b in triples)


def test_adamw_steps_the_masters_and_the_model_gets_them_rounded(tied_model):
    policy = HFPolicy(tied_model, MIXED, lr=LR, temperature=TEMPERATURE)
    micro = random_batch(6, seed=2).split(2)
    before = [m.detach().clone() for m in policy.weights.masters]
    captured = policy.capture_entropy_gradient(micro, pg_loss(micro))
    assert captured is not None
    # torch's fp32 AdamW on copies of the masters with the same fp32 gradient: the engine's step
    copies = [torch.nn.Parameter(b.clone()) for b in before]
    for copy, grad in zip(copies, captured.grads, strict=True):
        copy.grad = grad.clone()
    torch.optim.AdamW(copies, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0).step()

    result = policy.train_step(micro, pg_loss(micro), ())
    assert not result.skipped
    for master, copy in zip(policy.weights.masters, copies, strict=True):
        assert torch.equal(master, copy.detach())
    assert all(
        torch.equal(p, m.to(torch.bfloat16))
        for p, m in zip(policy.weights.params, policy.weights.masters, strict=True)
    )
    assert all(p.grad is None for p in (*policy.weights.params, *policy.weights.masters))


def test_a_move_along_the_entropy_gradient_reaches_the_bf16_model(tied_model):
    policy = HFPolicy(tied_model, MIXED, lr=LR, temperature=TEMPERATURE)
    micro = random_batch(4, seed=3).split(2)
    before = [m.detach().clone() for m in policy.weights.masters]
    captured = policy.capture_entropy_gradient(micro, pg_loss(micro))
    assert captured is not None
    captured.move(0.5)
    for master, b, g in zip(policy.weights.masters, before, captured.grads, strict=True):
        assert torch.equal(master, b + 0.5 * g)
    assert all(
        torch.equal(p, m.to(torch.bfloat16))
        for p, m in zip(policy.weights.params, policy.weights.masters, strict=True)
    )


def test_a_checkpoint_keeps_the_fp32_masters_and_resumes_them_exactly(tied_model, tmp_path):
    policy = HFPolicy(tied_model, MIXED, lr=LR, temperature=TEMPERATURE)
    micro = random_batch(4, seed=4).split(2)
    policy.train_step(micro, pg_loss(micro), ())
    policy.advance_schedule()
    policy.save(tmp_path / "ckpt")
    saved = load_file(tmp_path / "ckpt" / MODEL_SUBDIR / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in saved.values())

    resumed = HFPolicy(tied_model, MIXED, lr=LR, temperature=TEMPERATURE)
    resumed.load(tmp_path / "ckpt")
    for a, b in zip(policy.weights.masters, resumed.weights.masters, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(policy.weights.params, resumed.weights.params, strict=True):
        assert torch.equal(a, b)
    # the next step of both is the same step
    nxt = random_batch(4, seed=5).split(2)
    policy.train_step(nxt, pg_loss(nxt), ())
    resumed.train_step(nxt, pg_loss(nxt), ())
    for a, b in zip(policy.weights.masters, resumed.weights.masters, strict=True):
        assert torch.equal(a, b)


def test_the_bf16_samplers_logprobs_are_the_trainers_within_bf16_rounding(tied_model):
    """``rollout=engine`` samples with the bf16 model over its KV cache; the trainer's statistics
    come from a whole-sequence bf16 forward. Both round every activation to bf16 (``u = 2⁻⁸``)
    after fp32 accumulation, in other shapes, so a logit ``z_a`` may differ by a few bf16 units
    of its terms ``S = max_a Σ_i |h_i W_ai|``, and a logprob by twice that over ``T``."""
    policy = HFPolicy(tied_model, MIXED, lr=LR, temperature=TEMPERATURE)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (int(n),), generator=gen).tolist() for n in (2, 5, 8, 3)]
    sampling = SamplingConfig(temperature=TEMPERATURE, max_new_tokens=12, seed=3)
    completions = HFGenerator(policy.model, policy.device, 0, 3).generate(prompts, 3, sampling)
    batch = build_batch(
        [prompts[c.prompt_index] for c in completions],
        [c.token_ids for c in completions],
        torch.zeros(len(completions)),
        0,
        [c.logprobs for c in completions],
    )
    stats = policy.token_stats(batch)
    with torch.no_grad():
        out = policy.model(
            batch.input_ids, attention_mask=batch.attention_mask.long(), output_hidden_states=True
        )
        weight = policy.model.get_output_embeddings().weight.float()
        terms = (out.hidden_states[-1].float().abs() @ weight.abs().T).amax(dim=-1)[:, :-1]
    unit = 2 * U_BF16 / TEMPERATURE * terms[batch.response_mask].double()
    diff = (stats.logprob - batch.rollout_logprob)[batch.response_mask].abs().double()
    assert bool((diff <= BF16_UNITS * unit).all()), float((diff / unit).max())
    assert float(diff.max()) > 0  # the two paths do round differently: the bound is exercised
