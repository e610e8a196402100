"""The Megatron engine's training step on a GPU equals the ``hf`` engine's (TP = 1).

Written without a GPU and not run on one yet (tests/gpu/README.md). Skipped without CUDA or
megatron-core.

NeMo's ``MegatronGPTModel`` is not built here (NeMo and Transformer Engine need the NeMo image:
README.md): the megatron-core ``GPTModel`` (local layer spec, fp32, rope) in megatron's
``DistributedDataParallel`` with megatron's optimizer (``wrap_for_training``, distributed optimizer
off), loss closure and schedule that both engines hand to ``MegatronPolicy``, on CUDA with
megatron's own CUDA code paths (causal mask, rotary embedding, RNG tracker, memory buffer,
gradient norm and clipping) and NCCL. On one recorded rollout batch and the same weights (a tiny
random Qwen2 converted with ``hf_to_megatron``), against ``HFPolicy`` on the same GPU: the token
statistics, the update's loss and metrics, every clipped gradient (Hugging Face names; megatron's
reduced ``main_grad`` at its optimizer step, scaled by its clipping coefficient) and every weight
after the AdamW step are equal; the logprobs the loss pass computes equal the token-stats pass's.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA (README.md)", allow_module_level=True)
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

# Imported after the skips: megatron-core is not in every environment.
from opefo_nemo.config.engines import EngineConfig, MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import LossOutput, build_objective
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.models.megatron_weights import fetch_from_shards, hf_named_weights
from opefo_nemo.trainer.update import update_rollout_batch
from tests.engines.megatron.optimizer_capture import clipped, main_grads_at_steps
from tests.engines.megatron.tiny import hf_config, layout, megatron_gpt
from tests.engines.megatron.workers_policy import load_hf_into_megatron
from tests.metric_bounds import assert_metrics_close, loss_terms

TEMPERATURE = 0.7
METHOD = ("opefo", ["lr=1e-2"])
#: grad_clip below the reference's gradient norm (asserted), so clipping acts. AdamW's ε = 1e-4:
#: with 1e-8 the first step is lr·sign(g), and the key bias's gradient is zero in exact arithmetic
#: (softmax ignores a constant key shift), so its sign would be round-off noise.
ENGINE = {"warmup_steps": 3, "grad_clip": 0.05, "adam_eps": 1e-4}
MICRO_BATCH_SIZE = 2
#: Two implementations of the same fp32 statistics (other kernels, other reduction orders): a
#: handful of roundings per layer relative to the largest |logprob| (as
#: tests/engines/megatron/test_build).
FP32_REL = 128 * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def megatron_world():
    """One NCCL rank, megatron-core ``parallel_state`` at TP = PP = DP = 1."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from opefo_nemo.engines.megatron import compat

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    compat.initialize_model_parallel(1, 1, gloo_groups=True)  # megatron's optimizer asks for them
    model_parallel_cuda_manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 matmuls on both sides
    torch.backends.cudnn.allow_tf32 = False
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _recorded_batch():
    """Six responses of varying length behind varying prompts, fixed by a seed."""
    generator = torch.Generator().manual_seed(11)
    prompts, responses = [], []
    for _ in range(6):
        p, r = (
            int(torch.randint(lo, hi, (1,), generator=generator)) for lo, hi in ((2, 6), (1, 9))
        )
        prompts.append(torch.randint(1, 100, (p,), generator=generator).tolist())
        responses.append(torch.randint(1, 100, (r,), generator=generator).tolist())
    return build_batch(prompts, responses, torch.randn(6, generator=generator), pad_id=0)


def _save_qwen2(directory) -> None:
    import transformers

    config = transformers.AutoConfig.for_model(**hf_config("qwen2"), rms_norm_eps=1e-5)
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise)
    model.save_pretrained(directory, safe_serialization=True)


def _capture_hf(policy, grads: list) -> None:
    """``HFPolicy``: the clipped gradients, captured before the torch optimizer's step."""
    names = {param: name for name, param in policy.model.named_parameters()}
    policy.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append(
            {
                names[p]: p.grad.detach().to("cpu", copy=True)
                for g in opt.param_groups
                for p in g["params"]
            }
        )
    )


def _update(policy, batch):
    """Token stats, then the trainer's update, then the weights."""
    method = load_method(*METHOD)
    stats = policy.token_stats(batch)
    outcome = update_rollout_batch(policy, build_objective(method), batch, MICRO_BATCH_SIZE, seed=0)
    weights = {name: t.detach().to("cpu", copy=True) for name, t in policy.named_weights()}
    return stats, outcome, weights


def test_megatron_step_equals_hf_engine(megatron_world, tmp_path):
    from opefo_nemo.engines.hf import HFPolicy
    from opefo_nemo.engines.megatron.build import wrap_for_training

    _save_qwen2(tmp_path)
    batch = _recorded_batch()
    lr = load_method(*METHOD).lr

    hf = HFPolicy(
        tmp_path,
        EngineConfig(device="cuda", dtype="float32", micro_batch_size=MICRO_BATCH_SIZE, **ENGINE),
        lr=lr,
        temperature=TEMPERATURE,
    )
    hf_grads: list = []
    _capture_hf(hf, hf_grads)
    want = (*_update(hf, batch), hf_grads)

    shape = layout("qwen2")
    model = megatron_gpt(shape).cuda()
    load_hf_into_megatron(model, shape, tmp_path, stage=0, tp_rank=0)
    config = MegatronEngineConfig(
        dtype="float32",
        micro_batch_size=MICRO_BATCH_SIZE,
        use_distributed_optimizer=False,
        **ENGINE,
    )
    policy = wrap_for_training(model, shape, config, lr=lr, temperature=TEMPERATURE)
    with main_grads_at_steps(policy) as steps:
        stats, outcome, weights = _update(policy, batch)
    grads = [clipped(g, norm, ENGINE["grad_clip"]) for g, norm in steps]

    valid = batch.response_mask  # HFPolicy computes response columns only (prompts hold 0)
    for field in ("logprob", "entropy"):
        ours, theirs = getattr(stats, field), getattr(want[0], field)
        bound = FP32_REL * float(theirs[valid].abs().max())
        torch.testing.assert_close(ours[valid], theirs[valid], rtol=0, atol=bound, msg=field)
    assert outcome.skipped_steps == want[1].skipped_steps == 0
    assert want[1].metrics["grad/norm"] > ENGINE["grad_clip"]
    lam = want[1].metrics["flow/lambda"]
    loss = loss_terms(want[0].logprob, batch.advantages, batch.response_mask, lam)
    assert_metrics_close(outcome.metrics, want[1].metrics, rel=1e-4, scales={"loss": loss})
    (ours,), (theirs,) = grads, want[3]
    converted = dict(hf_named_weights(shape, fetch_from_shards(shape, {(0, 0): ours})))
    assert converted.keys() == theirs.keys()
    for name, grad in theirs.items():
        torch.testing.assert_close(converted[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # AdamW's first step moves a weight by lr·g/(|g| + ε): for gradients near ε the round-off
    # the gradient tolerance allows shows up as a fraction of lr, hence 1 % of lr.
    assert weights.keys() == want[2].keys()
    for name, weight in want[2].items():
        torch.testing.assert_close(weights[name], weight, rtol=0, atol=0.01 * lr, msg=name)

    micros = batch.split(MICRO_BATCH_SIZE)
    expected = [policy.token_stats(m).logprob for m in micros]
    seen = {}

    def recording_loss(index, with_grad):
        seen[index] = with_grad.logprob.detach().cpu()
        mask = micros[index].response_mask.to(with_grad.logprob.device)
        return LossOutput(-(with_grad.logprob * mask).sum() / batch.n_response_tokens, {})

    policy.train_step(micros, recording_loss, ())
    assert sorted(seen) == list(range(len(micros)))
    for index, logprob in seen.items():
        mask = micros[index].response_mask
        bound = FP32_REL * float(expected[index][mask].abs().max())
        torch.testing.assert_close(logprob[mask], expected[index][mask], rtol=0, atol=bound)
