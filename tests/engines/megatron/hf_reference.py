"""The hf engine's side of the megatron engine's comparisons: Hugging Face directories of the tiny
model families, the engine settings the cases share, and the hf engine's update of a batch as
their reference."""

from __future__ import annotations

import torch

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.parallel import VOCAB_SUMS
from opefo_nemo.trainer.update import update_rollout_batch

from .tiny import hf_config, hf_model

FP32 = {"dtype": "float32", "transformer_engine": False}
TP2_SP = {"tensor_model_parallel_size": 2, "sequence_parallel": True}

#: The rows of the batch the policy comparisons update.
ROWS = 4
OPEFO = ("opefo", ["lr=1e-2"])
NO_CLIP = {"warmup_steps": 3, "grad_clip": 0.0, "adam_eps": 1e-4}
#: Below the reference's gradient norm (asserted), so clipping acts.
CLIP = {"warmup_steps": 3, "grad_clip": 0.05, "adam_eps": 1e-4}


def hf_dir(tmp_path, family: str, seed: int = 0, scale: float = 1.0, name: str = ""):
    model = hf_model(family, seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(scale)
    config = model.config
    config.rms_norm_eps = 1e-5  # neither megatron's default nor transformers'
    config.rope_parameters = {"rope_type": "default", "rope_theta": 5000.0}
    directory = tmp_path / (name or family)
    model.save_pretrained(directory)
    return directory


def save_hf_model(family: str, directory) -> None:
    """Random weights at a scale with non-degenerate softmaxes; megatron's RMSNorm ε (1e-5)."""
    import transformers

    config = transformers.AutoConfig.for_model(**hf_config(family), rms_norm_eps=1e-5)
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise)
    model.save_pretrained(directory, safe_serialization=True)


def hf_reference(hf_dir, method_overrides, engine, batch) -> dict:
    from opefo_nemo.engines.hf import HFPolicy

    from .workers_policy import TEMPERATURE

    method = load_method(*method_overrides)
    config = EngineConfig(dtype="float32", micro_batch_size=batch.rows, **engine)
    policy = HFPolicy(hf_dir, config, lr=method.lr, temperature=TEMPERATURE)
    stats = policy.token_stats(batch, sums=VOCAB_SUMS)
    names = {param: name for name, param in policy.model.named_parameters()}
    captured = []
    policy.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: captured.append(
            {names[p]: p.grad.clone() for group in opt.param_groups for p in group["params"]}
        )
    )
    outcome = update_rollout_batch(policy, build_objective(method), batch, batch.rows, seed=0)
    weights = {name: tensor.clone() for name, tensor in policy.named_weights()}
    return {"stats": stats, "metrics": outcome.metrics, "grads": captured, "weights": weights}
