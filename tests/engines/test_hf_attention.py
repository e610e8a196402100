"""``engine.attention`` in the ``hf`` engine: the attention implementation every forward runs
with, and eager attention's statistics against sdpa's within what bf16 rounding allows (the
two compute the same softmax in other orders; docs/performance.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.models.transformers_compat import load_causal_lm

ENGINE = EngineConfig(warmup_steps=0, micro_batch_size=3)
TEMPERATURE = 0.7
U_BF16 = 2.0**-8
#: bf16 units of a logit's terms by which eager's and sdpa's logit may differ: each rounds every
#: activation to bf16 after fp32 accumulation, in other orders, so a logit moves by a few units
#: of its terms; the sampler-against-trainer comparison of the same rounding saw 0.31 units.
BF16_UNITS = 2.0


def random_batch(rows: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 60, (3 + n,), generator=gen).tolist() for n in range(rows)]
    responses = [torch.randint(3, 60, (6 + n % 3,), generator=gen).tolist() for n in range(rows)]
    return build_batch(prompts, responses, torch.zeros(rows), pad_id=0)


def implementations_seen(policy: HFPolicy, batch) -> set[str]:
    """The attention implementation of the first layer in each forward of ``token_stats``."""
    seen = set()

    def record(module, args, kwargs):
        seen.add(module.config._attn_implementation)

    layer = policy.model.model.layers[0].self_attn
    hook = layer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        policy.token_stats(batch)
    finally:
        hook.remove()
    return seen


@pytest.mark.parametrize("attention", ["default", "eager", "sdpa"])
def test_every_forward_attends_with_the_configured_implementation(tiny_model_dir, attention):
    own = load_causal_lm(tiny_model_dir, torch.float32).config._attn_implementation
    assert own != "eager"  # else `default` and `eager` could not be told apart
    engine = dataclasses.replace(ENGINE, attention=attention)
    policy = HFPolicy(tiny_model_dir, engine, lr=1e-3, temperature=TEMPERATURE)
    want = own if attention == "default" else attention
    assert implementations_seen(policy, random_batch(5, seed=0)) == {want}


def test_eager_statistics_are_sdpas_within_bf16_rounding(tiny_model_dir):
    """A logprob of ``softmax(z / T)`` moves by at most twice a logit's change over ``T``; a
    logit by a few bf16 units ``u = 2⁻⁸`` of its terms ``S = max_a Σ_i |h_i W_ai|``."""
    batch = random_batch(6, seed=1)
    stats = {}
    for attention in ("eager", "sdpa"):
        engine = dataclasses.replace(ENGINE, dtype="bfloat16", attention=attention)
        policy = HFPolicy(tiny_model_dir, engine, lr=1e-3, temperature=TEMPERATURE)
        stats[attention] = policy.token_stats(batch)
    with torch.no_grad():
        out = policy.model(
            batch.input_ids, attention_mask=batch.attention_mask.long(), output_hidden_states=True
        )
        weight = policy.model.get_output_embeddings().weight.float()
        terms = (out.hidden_states[-1].float().abs() @ weight.abs().T).amax(dim=-1)[:, :-1]
    mask = batch.response_mask
    unit = (2 * U_BF16 / TEMPERATURE * terms[mask]).double()
    diff = (stats["eager"].logprob - stats["sdpa"].logprob)[mask].abs().double()
    assert bool((diff <= BF16_UNITS * unit).all()), float((diff / unit).max())
    assert float(diff.max()) > 0  # the two do round differently: the bound is exercised
    entropy_diff = (stats["eager"].entropy - stats["sdpa"].entropy)[mask].abs().double()
    # H = -Σ p log p moves by at most max |Δ log p| · (1 + |log p| weighted): 2 · (1 + H) · Δz/T
    entropy_bound = BF16_UNITS * unit * (1 + stats["sdpa"].entropy[mask].double())
    assert bool((entropy_diff <= entropy_bound).all())
