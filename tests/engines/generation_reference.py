"""What ``rollout=engine``'s samples are checked against (tests/engines/test_hf_generation*.py):
the sampling settings and prompts of those tests, the rounding bound of a logprob, and each
sampled token against the brute-force sampler's choice for its row alone: the whole sequence's
forward (no KV cache, no padding, no other rows) and the row's own uniform."""

from __future__ import annotations

import torch

from opefo_nemo.rollout.types import Completion, SamplingConfig
from tests.metric_bounds import U32
from tests.trainer.update_inputs import TEMPERATURE

STOP = (5, 7)
#: bf16's unit round-off.
U16 = 2.0**-8
#: bf16 rounds every layer's output, so two reduction orders through the model move a logit by
#: the rounding of the layers before the last product too: seen up to 0.64 × ``u₁₆·S`` over
#: the tiny model's layers (KV cache against the whole sequence), so a margin of 2.
BF16_LAYERS_MARGIN = 2.0


def sampling(**overrides) -> SamplingConfig:
    settings = {
        "temperature": TEMPERATURE,
        "max_new_tokens": 12,
        "stop_token_ids": STOP,
        "seed": 3,
    }
    return SamplingConfig(**{**settings, **overrides})


def ragged_prompts(count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (count,), generator=gen).tolist()
    return [torch.randint(3, 60, (n,), generator=gen).tolist() for n in lengths]


def logprob_bound(model, ids, mask, temperature: float) -> torch.Tensor:
    """``[B, T]``: how far a logprob of the next token may move when the logits behind it are
    computed in another reduction order (KV cache against the whole sequence, left against
    right padding, another batch size).

    The last reduction of a logit ``z_a`` is a hidden-size dot product, off by at most ``d·u·S``
    in fp32 (``S = max_a Σ_i |h_i W_ai|``, its terms); the layers before contribute errors of
    the same relative size. A logprob ``z_y/T − lse(z/T)`` (over any kept set) moves by at most
    ``2·max|δz|/T``: the bound is ``2·d·u·S/T``. In bf16 every product's output is rounded to
    ``u₁₆`` whatever its length, which dominates: ``2·BF16_LAYERS_MARGIN·u₁₆·S/T``.
    """
    with torch.no_grad():
        out = model(ids, attention_mask=mask.long(), output_hidden_states=True)
        weight = model.get_output_embeddings().weight.detach().float()
        terms = (out.hidden_states[-1].float().abs() @ weight.abs().T).amax(dim=-1)
    bf16 = model.get_output_embeddings().weight.dtype == torch.bfloat16
    rounding = BF16_LAYERS_MARGIN * U16 if bf16 else U32 * weight.shape[1]
    return 2 * rounding / temperature * terms.double()


def row_uniforms(seed: int, steps: int) -> torch.Tensor:
    """A row's uniforms as docs/rollout.md, "Generation by the training engine", states them
    (its seeds): ``steps`` float64 draws of a CPU generator seeded ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(steps, dtype=torch.float64, generator=generator)


def check_completions(
    model, prompts: list[list[int]], n: int, settings: SamplingConfig, got: list[Completion]
) -> tuple[int, int]:
    """Every token of ``got`` is the one its row's own uniform picks (docs/rollout.md, "Generation
    by the training engine", its seeds) from the distribution of the whole sequence before it, up to
    rounding; its logprob is that distribution's within the bound; each completion ends at its first
    stop token or at ``max_new_tokens``. Returns ``(tokens, decisive)``: how many tokens were
    checked, and at how many no rounding within the bound could have picked another token.

    With every logprob within ``ε``, each partial sum of the cumulative distribution moves by at
    most ``(e^ε − 1)`` of the total, and so does the uniform's point: the token is admissible
    when the point lies within the token's interval widened by twice that, decisive when it
    lies within the interval narrowed by as much."""
    assert settings.top_k == 0 and settings.top_p == 1  # the full tempered softmax below
    assert [(c.prompt_index, c.sample_index) for c in got] == [
        (i, j) for i in range(len(prompts)) for j in range(n)
    ]
    checked = decisive = 0
    for c in got:
        prompt, length = prompts[c.prompt_index], len(c.token_ids)
        seed = settings.seed + c.prompt_index * n + c.sample_index
        uniforms = row_uniforms(seed, settings.max_new_tokens)[:length]
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits / settings.temperature, dim=-1).double()
        cdf = logp.exp().cumsum(dim=-1)
        token = torch.tensor(c.token_ids)
        high = cdf.gather(1, token[:, None])[:, 0]
        low = torch.where(token > 0, cdf.gather(1, (token - 1).clamp(min=0)[:, None])[:, 0], 0.0)
        point = uniforms * cdf[:, -1]
        bound = logprob_bound(model, ids, torch.ones_like(ids), settings.temperature)
        bound = bound[0, len(prompt) - 1 : -1]
        shift = 2 * torch.expm1(bound) * cdf[:, -1]
        assert bool(((low - shift <= point) & (point <= high + shift)).all()), c
        decisive += int(((low + shift < point) & (point < high - shift)).sum())
        got_logp = torch.tensor(c.logprobs, dtype=torch.float64)
        want_logp = logp.gather(1, token[:, None])[:, 0]
        assert bool(((got_logp - want_logp).abs() <= bound).all()), c
        stops = [t in settings.stop_token_ids for t in c.token_ids]
        assert not any(stops[:-1])
        assert c.finish_reason == ("stop" if stops[-1] else "length")
        assert stops[-1] or length == settings.max_new_tokens
        checked += length
    return checked, decisive
