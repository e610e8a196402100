"""``rollout=engine``'s decode batch (``engines/hf_generation.py``): a row leaves it when it
ends and waiting rows join it, and every row still samples what the brute-force sampler of
tests/engines/generation_reference.py samples for it alone, in fp32 and bf16, on transformers'
cache, a legacy tuple cache, and a sliding-window cache that rows can only leave."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache, Qwen2ForCausalLM

from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.engines.hf_generation import HFGenerator
from tests.engines.generation_reference import check_completions, ragged_prompts, sampling
from tests.trainer.update_inputs import ENGINE, TEMPERATURE, tiny_model

ROWS = 5  # rows decoding together: fewer than the 27 rows of a call, so rows wait and join
N = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def spread_prompts() -> list[list[int]]:
    """9 prompts, the 3rd given twice (its samples share one prompt forward)."""
    prompts = ragged_prompts(8, seed=7)
    return [*prompts, list(prompts[2])]


#: One stop token, 24 new tokens at most: on the tiny model the 27 rows end after 1 to 24
#: tokens, about half of them at the cap.
SPREAD = sampling(max_new_tokens=24, stop_token_ids=(5,))


def forwards(model: torch.nn.Module, run) -> list[tuple[int, int]]:
    """``(rows, columns)`` of every forward of ``model`` while ``run()`` generates."""
    shapes: list[tuple[int, int]] = []

    def record(module, args, kwargs):
        shapes.append(tuple(kwargs["hidden_states"].shape[:2]))

    attention = model.get_decoder().layers[0].self_attn
    hook = attention.register_forward_pre_hook(record, with_kwargs=True)
    try:
        run()
    finally:
        hook.remove()
    return shapes


def decoded_rows(shapes: list[tuple[int, int]]) -> list[int]:
    return [rows for rows, columns in shapes if columns == 1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_leave_when_they_end_and_waiting_rows_join(model_dir, dtype):
    policy = HFPolicy(
        model_dir, dataclasses.replace(ENGINE, dtype=dtype), lr=1e-3, temperature=TEMPERATURE
    )
    prompts, got = spread_prompts(), []
    generator = HFGenerator(policy.model, policy.device, 0, ROWS)
    shapes = forwards(policy.model, lambda: got.extend(generator.generate(prompts, N, SPREAD)))
    lengths = [len(c.token_ids) for c in got]
    assert min(lengths) <= 3 and max(lengths) == 24  # the settings spread the lengths
    assert {c.finish_reason for c in got} == {"stop", "length"}

    # every token's forward is of a row that goes on: a row's first token comes from its
    # prompt's forward, each later one from one row of a one-token forward
    assert sum(decoded_rows(shapes)) == sum(length - 1 for length in lengths)
    assert max(decoded_rows(shapes)) == ROWS
    # prompts' forwards run while other rows decode (both before and after them)
    later = [t for t, (_, columns) in enumerate(shapes) if columns > 1 and t]
    assert any(0 < t < len(shapes) - 1 and shapes[t - 1][1] == 1 for t in later)

    checked, decisive = check_completions(policy.model, prompts, N, SPREAD, got)
    assert checked == sum(lengths)
    if dtype == "float32":  # the bound pins nearly every token to the brute-force one
        assert decisive >= 0.9 * checked
    else:  # bf16's bound leaves a window of tokens; another seed's samples fall outside it
        other = generator.generate(prompts, N, dataclasses.replace(SPREAD, seed=SPREAD.seed + 1))
        with pytest.raises(AssertionError):
            check_completions(policy.model, prompts, N, SPREAD, other)


class LegacyCacheLM(torch.nn.Module):
    """A causal LM of the legacy cache interface (older transformers, remote code): the cache
    comes and goes as a per-layer ``(key, value)`` tuple; no ``logits_to_keep`` keyword and no
    ``set_attn_implementation`` (the attention is switched on the config). It computes with
    the tiny model inside."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.tuples_in = 0

    def forward(self, input_ids, attention_mask, position_ids, use_cache, past_key_values=None):
        if past_key_values is not None:
            assert isinstance(past_key_values, tuple)
            self.tuples_in += 1
            past_key_values = DynamicCache(past_key_values)
        out = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        layers = tuple((layer.keys, layer.values) for layer in out.past_key_values.layers)
        return SimpleNamespace(logits=out.logits, past_key_values=layers)


def test_a_legacy_tuple_cache_leaves_and_joins_alike(model_dir):
    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    legacy = LegacyCacheLM(policy.model)
    prompts = spread_prompts()
    generator = HFGenerator(legacy, policy.device, 0, ROWS)
    got: list = []
    shapes = forwards(policy.model, lambda: got.extend(generator.generate(prompts, N, SPREAD)))
    assert legacy.tuples_in == len(decoded_rows(shapes)) > 0
    assert sum(decoded_rows(shapes)) == sum(len(c.token_ids) - 1 for c in got)
    assert any(columns > 1 and t and shapes[t - 1][1] == 1 for t, (_, columns) in enumerate(shapes))
    checked, decisive = check_completions(policy.model, prompts, N, SPREAD, got)
    assert decisive >= 0.9 * checked
    assert policy.model.config._attn_implementation != "eager"  # restored on the config


def test_a_sliding_window_cache_lets_rows_leave_but_not_join(model_dir):
    """transformers' sliding-window layers keep more state than their tensors, so rows join
    only an empty batch; finished rows still leave. The window spans every sequence here, so
    the samples are the full-attention model's."""
    layers = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE).model.config
    model = Qwen2ForCausalLM.from_pretrained(
        model_dir,
        use_sliding_window=True,
        sliding_window=4096,
        layer_types=["sliding_attention"] * layers.num_hidden_layers,
    )
    assert set(model.config.layer_types) == {"sliding_attention"}
    prompts, got = spread_prompts(), []
    generator = HFGenerator(model, torch.device("cpu"), 0, ROWS)
    shapes = forwards(model, lambda: got.extend(generator.generate(prompts, N, SPREAD)))
    assert sum(decoded_rows(shapes)) == sum(len(c.token_ids) - 1 for c in got)
    runs, current = [], []  # the one-token forwards between two prompts' forwards
    for rows, columns in shapes[1:]:
        if columns == 1:
            current.append(rows)
        else:
            runs.append(current)
            current = []
    runs.append(current)
    assert len(runs) == -(-len(got) // ROWS)  # a batch of ROWS rows at a time
    assert all(run == sorted(run, reverse=True) for run in runs)  # rows only leave
    checked, decisive = check_completions(model, prompts, N, SPREAD, got)
    assert decisive >= 0.9 * checked
