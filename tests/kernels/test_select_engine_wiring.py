"""``engine.stats_kernel`` reaches the statistics of the hf engine, and the Triton kernel gives the
torch kernel's statistics and gradient norm on the tiny model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core.objectives import LossOutput
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.parallel import VOCAB_SUMS, TokenStats

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy on ±inf

ENGINE = EngineConfig(grad_clip=0.0, warmup_steps=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", TinyModelSpec(), seed=0)


def _batch():
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40, (n,), generator=gen).tolist() for n in (3, 5)]
    responses = [torch.randint(3, 40, (n,), generator=gen).tolist() for n in (4, 2)]
    return build_batch(prompts, responses, torch.tensor([1.0, -0.5]), pad_id=0)


def _policy(model_dir, kernel: str) -> HFPolicy:
    config = dataclasses.replace(ENGINE, stats_kernel=kernel)
    return HFPolicy(model_dir, config, lr=1e-3, temperature=0.7)


def test_the_configured_kernel_is_the_one_that_runs(model_dir, monkeypatch):
    """Outside the interpreter a CPU engine with ``stats_kernel=triton`` must refuse, so the
    key demonstrably reaches ``token_stats``."""
    policy = _policy(model_dir, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        policy.token_stats(_batch())


def test_triton_equals_torch_on_the_tiny_model(model_dir):
    """Both kernels within fp32 round-off of each other (logits of scale ~1 over a vocabulary of
    tens: the bound of tests/kernels/tolerances.py is ~1e-5; 1e-4 leaves a margin for the
    model's own fp32 forward, which is the same in both)."""
    batch = _batch()
    results = {}
    for kernel in ("torch", "triton"):
        policy = _policy(model_dir, kernel)
        stats = policy.token_stats(batch, sums=VOCAB_SUMS)

        def loss_fn(index: int, s: TokenStats):
            loss = -(s.logprob * batch.response_mask).sum() - 0.1 * s.entropy.sum()
            return LossOutput(loss, {})

        update = policy.train_step([batch], loss_fn, ())
        results[kernel] = (stats, update.grad_norm)
    (ours, norm), (theirs, ref_norm) = results["triton"], results["torch"]
    for name in ("logprob", "entropy", *VOCAB_SUMS):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), atol=1e-4, rtol=1e-4)
    assert abs(norm - ref_norm) <= 1e-4 * ref_norm
