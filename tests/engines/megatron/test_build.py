"""``engine=megatron`` built by the product from a Hugging Face directory
(:mod:`opefo_nemo.engines.megatron.build`), on real gloo CPU ranks.

- The ``GPTModel`` built from ``config.json`` (norm ε, rope base, q/k/v biases, Qwen3's q/k
  norms, tied embeddings) with the safetensors streamed into its shards computes the token
  statistics of a ``transformers`` forward of the same directory: fp32 at TP 1, and at TP 2 with
  sequence parallelism (sequences padded to a multiple of TP), within fp32 round-off.
- bf16 at TP 2 with sequence parallelism: no farther from the fp32 statistics (of the
  bf16-rounded weights) than ``transformers``' own bf16 forward is, up to a factor 4 (two
  implementations of the same bf16 arithmetic, in different orders). The random N(0, 1) weights
  of the fp32 checks make a chaotic model whose bf16 forward is off by nats; this one takes
  weights of scale 0.1, where bf16 is meaningful.
- Activation recomputation on or off: the same update, bit for bit.
- Activation recomputation on or off (TP 2, Qwen3): the same update, bit for bit.
- Qwen3 at TP 2 × sequence parallel: the update (metrics, weights) equals the ``hf`` engine's.
- bf16 parameters with fp32 main weights, distributed optimizer, TP 2 × sequence parallel, and
  DP 2 × distributed optimizer: an OPEFO update, a checkpoint, a fresh policy loaded from it:
  the loaded weights are the saved ones bit for bit, and the next update from the checkpoint
  equals the uninterrupted one bit for bit (weights and metrics); ``opefo-export``'s function
  turns the checkpoint (megatron's optimizer state beside the weights) into a Hugging Face
  directory that ``transformers`` loads with exactly the saved weights.
"""

from __future__ import annotations

import json

import pytest
import torch

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.models.megatron_weights.export import export_sharded
from opefo_nemo.trainer.update import update_rollout_batch
from tests.metric_bounds import assert_metrics_close, loss_terms
from tests.parallel.world import run_world

from .hf_reference import FP32, TP2_SP, hf_dir
from .tiny import random_batch

pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

from . import workers_build  # noqa: E402  (imports megatron-core helpers)

ROWS, VOCAB = 6, 100
FP32_EPS = torch.finfo(torch.float32).eps
BF16_EPS = torch.finfo(torch.bfloat16).eps
#: A handful of fp32 roundings per layer (4 layers, reductions of width ≤ 100) relative to the
#: largest |logprob|: observed ~5e-7, allowed 2⁷ ε₃₂ ≈ 1.5e-5.
FP32_REL = 128 * FP32_EPS


def _reference(directory, batch, dtype=torch.float32, forward_dtype=torch.float32):
    """Token statistics (temperature-scaled, spec §1) of a ``transformers`` forward in
    ``forward_dtype`` of the directory's weights, rounded to ``dtype`` first."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(dtype).float())
        model = model.to(forward_dtype)
        logits = model(input_ids=batch.input_ids).logits[:, :-1].float()
        logits = logits / workers_build.TEMPERATURE
    logp = torch.log_softmax(logits.double(), -1)
    logprob = logp.gather(-1, batch.targets[..., None])[..., 0]
    entropy = -(logp.exp() * logp).sum(-1)
    return logprob.float(), entropy.float()


def _errors(got, want, mask) -> tuple[list[float], float]:
    """Max |difference| of each statistic over the response tokens, and the largest |logprob|
    of ``want``."""
    width = got[0].shape[1]
    selected = mask[:, :width]
    scale = float(want[0][:, :width][selected].abs().max())
    errors = [
        float((ours[selected] - theirs[:, :width][selected]).abs().max())
        for ours, theirs in zip(got, want, strict=True)
    ]
    return errors, scale


def _assert_stats_close(got, want, mask, rel) -> None:
    """Both statistics are functions of the logits: an error ``δ`` in the logits moves a
    logprob by at most ``2δ`` and the entropy by at most ``2δ`` too (``H`` is 1-Lipschitz in
    each log-probability under the ∞-norm, weighted by ``p``). ``δ`` is ``rel`` of the logits'
    magnitude, bounded by the largest |logprob| of the reference."""
    errors, scale = _errors(got, want, mask)
    for error, name in zip(errors, ("logprob", "entropy"), strict=True):
        assert error <= 2 * rel * scale, (name, error, scale)


@pytest.fixture(scope="module")
def batch():
    return random_batch(ROWS, VOCAB, seed=3)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    dirs = {family: hf_dir(root, family) for family in ("qwen2", "qwen2_tied", "qwen3", "llama")}
    dirs["qwen2_small"] = hf_dir(root, "qwen2", scale=0.1, name="qwen2_small")
    return dirs


def test_built_engine_equals_transformers(families, batch, tmp_path):
    fp32 = [(str(families[f]), FP32) for f in ("qwen2", "qwen2_tied", "qwen3", "llama")]
    fp32 += [(str(families[f]), {**FP32, **TP2_SP}) for f in ("qwen2", "qwen3")]
    bf16 = (str(families["qwen2_small"]), {"transformer_engine": False, **TP2_SP})
    run_world(workers_build.token_stats_of_built_engines, 2, [*fp32, bf16], batch, str(tmp_path))
    for index, (directory, _) in enumerate(fp32):
        got = torch.load(tmp_path / f"stats_{index}.pt")
        _assert_stats_close(got, _reference(directory, batch), batch.response_mask, FP32_REL)
    got = torch.load(tmp_path / f"stats_{len(fp32)}.pt")
    exact = _reference(bf16[0], batch, torch.bfloat16)
    theirs = _reference(bf16[0], batch, torch.bfloat16, torch.bfloat16)
    ours_errors, scale = _errors(got, exact, batch.response_mask)
    their_errors, _ = _errors(theirs, exact, batch.response_mask)
    for ours, their in zip(ours_errors, their_errors, strict=True):
        assert ours <= 4 * their + 2 * BF16_EPS * scale, (ours, their, scale)


@pytest.mark.parametrize(
    "settings",
    [
        {"transformer_engine": False, **TP2_SP},
        {"transformer_engine": False, "use_distributed_optimizer": True},
    ],
    ids=["bf16-tp2-sp-distopt", "bf16-dp2-distopt"],
)
def test_bf16_distributed_optimizer_resumes_bit_exactly(families, batch, settings, tmp_path):
    from opefo_nemo.engines.megatron import compat

    problem = compat.distributed_optimizer_checkpoint_problem()
    if problem is not None:
        pytest.skip(problem)
    run_world(
        workers_build.update_save_resume,
        2,
        str(families["qwen2_small"]),
        {**settings, "warmup_steps": 1},
        batch,
        str(tmp_path),
    )
    result = torch.load(tmp_path / "resume.pt")
    assert result["first"]["grad/norm"] > 0 and result["skipped"] == 0
    saved, straight = result["saved"], result["straight"]
    assert any(not torch.equal(saved[n], straight[n]) for n in saved), "the update moved nothing"
    for name, tensor in result["saved"].items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(result["loaded"][name], tensor), name
        assert torch.equal(result["resumed"][name], result["straight"][name]), name
    assert json.dumps(result["resumed_second"]) == json.dumps(result["second"])
    exported = export_sharded(
        tmp_path / "checkpoint", families["qwen2_small"], tmp_path / "exported"
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.bfloat16)
    state = model.state_dict()
    for name, tensor in result["saved"].items():
        assert torch.equal(state[name], tensor), name


def test_activation_recomputation_changes_nothing(families, batch, tmp_path):
    """Full recomputation reruns the same forward in the backward: the same update, bit for bit
    (fp32, CPU, deterministic kernels), with fewer activations kept."""
    run_world(
        workers_build.recompute_changes_nothing, 2, str(families["qwen3"]), batch, str(tmp_path)
    )
    (plain_metrics, plain), (recomputed_metrics, recomputed) = torch.load(tmp_path / "recompute.pt")
    assert plain_metrics["grad/norm"] > 0
    assert recomputed_metrics == plain_metrics
    for name, tensor in plain.items():
        assert torch.equal(recomputed[name], tensor), name


def test_qwen3_update_at_tp2_equals_the_hf_engine(families, batch, tmp_path):
    """Qwen3's q/k norms are replicated over TP while each TP rank normalises its own heads: their
    gradient is the sum over TP, which megatron's ``finalize_model_grads`` forms. The built
    engine's OPEFO update at TP 2 × sequence parallel (fp32, megatron's optimizer) equals
    ``HFPolicy``'s: every metric within fp32 round-off (1e-4 of the magnitude of its terms,
    tests/metric_bounds.py: reductions in other orders, amplified through one AdamW step) and
    every weight within 1 % of the lr (AdamW moves
    a weight by lr·g/(|g| + ε), so round-off in a tiny g shows up as a fraction of lr)."""
    settings = {"warmup_steps": 1, **FP32, **TP2_SP}
    run_world(workers_build.one_update, 2, str(families["qwen3"]), settings, batch, str(tmp_path))
    metrics, weights = torch.load(tmp_path / "update.pt")
    engine = EngineConfig(dtype="float32", warmup_steps=1)
    method = load_method("opefo", ["lr=1e-3"])
    reference = HFPolicy(
        families["qwen3"], engine, lr=method.lr, temperature=workers_build.TEMPERATURE
    )
    stats = reference.token_stats(batch)
    want = update_rollout_batch(reference, build_objective(method), batch, batch.rows, 0).metrics
    assert metrics["grad/norm"] > 0
    loss = loss_terms(stats.logprob, batch.advantages, batch.response_mask, want["flow/lambda"])
    assert_metrics_close(metrics, want, rel=1e-4, scales={"loss": loss})
    for name, weight in reference.named_weights():
        torch.testing.assert_close(weights[name], weight, rtol=0, atol=0.01 * method.lr)
