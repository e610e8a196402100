"""vLLM's CPU build (in the rollout environment when it is built, else this one) loads the
converted directory, tokenizer configuration included, and generates: the responses decode to
text, stop at the chat template's end of turn, and their logprobs are the temperature-scaled
logprobs of a ``transformers`` forward of the same weights."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.data import Problem
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.data.stop_tokens import stop_tokens
from opefo_nemo.rollout import SamplingConfig, VLLMRolloutEngine
from tests.real.chat_reference import QUESTIONS, rollout_python
from tests.rollout.reference import hf_sampled_logprobs, load_hf_model

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
TEMPERATURE = 0.7
#: fp32 on both sides, 30 layers, different kernels: allowed 1e-3 of the largest |logprob|.
LOGPROB_REL = 1e-3


def test_vllm_generates_from_the_converted_directory(smollm2_dir):
    codec = PromptCodec(smollm2_dir, "raw")
    prompts = [codec.encode(Problem(f"q{i}", q, "", "test")) for i, q in enumerate(QUESTIONS)]
    stop = stop_tokens(codec)
    sampling = SamplingConfig(
        temperature=TEMPERATURE, max_new_tokens=24, stop_token_ids=stop.ids, seed=3
    )
    with VLLMRolloutEngine(
        smollm2_dir,
        python=rollout_python(),
        dtype="float32",
        max_model_len=128,
        startup_timeout_s=600,
    ) as engine:
        completions = engine.generate(prompts, 2, sampling)
    assert len(completions) == 6
    model = load_hf_model(smollm2_dir)
    for c in completions:
        assert 1 <= len(c.token_ids) <= 24 and len(c.logprobs) == len(c.token_ids)
        assert codec.decode(c.token_ids).strip(), c.token_ids
        if c.finish_reason != "length":
            assert c.token_ids[-1] in stop.ids
        want = hf_sampled_logprobs(model, prompts[c.prompt_index], c.token_ids, TEMPERATURE)
        error = float((torch.tensor(c.logprobs) - want).abs().max())
        assert error <= LOGPROB_REL * max(float(want.abs().max()), 1.0), error
