"""Rank function of ``test_policy_layout.py``: one ``MegatronPolicy`` step of a batch under several
micro-batch layouts (``engine=megatron``'s own builder, ``engine.device=cpu``, gloo ranks spawned
by ``tests.parallel.world``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.core.objectives import LossOutput
from opefo_nemo.engines.batch_layout import MicroBatchLayout
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.model_checks import check_model
from opefo_nemo.models.megatron_weights import MegatronLayout
from opefo_nemo.parallel import VOCAB_SUMS

from .optimizer_capture import clipped, main_grads_at_steps
from .tiny import hf_config, megatron_gpt, release_parallel_state
from .tiny import layout as tiny_layout
from .workers_policy import STAT_FIELDS, hf_names

#: The rollout temperature of the statistics (spec §1), the learning rate and the entropy bonus
#: of the step's loss.
TEMPERATURE = 0.7
LR = 1e-2
ENTROPY_BONUS = 0.01
SUM_NAMES = ("logprob", "entropy")


def layout_steps(
    rank: int, world_size: int, hf_dir: str, cases: list[dict], batch, out_dir: str
) -> None:
    """For each case (``engine``: MegatronEngineConfig keys shared by its layouts; ``layouts``:
    ``{name: {"rows": …, "owners": …, "engine": extra keys}}``, ``rows`` ``None`` for the
    engine's own forward-only layout and equal contiguous blocks of ``micro_batch_size`` rows), a
    fresh policy per layout runs :func:`_one_step`; rank 0 saves ``{name: result}`` as
    ``out_dir/case_<i>.pt``."""
    warnings.filterwarnings("ignore")
    from opefo_nemo.engines.megatron.build import build_megatron_policy

    for index, case in enumerate(cases):
        try:
            results = {}
            for name, layout in case["layouts"].items():
                engine = MegatronEngineConfig(
                    device="cpu",
                    dtype="float32",
                    transformer_engine=False,
                    make_vocab_size_divisible_by=8,
                    **case["engine"],
                    **layout.get("engine", {}),
                )
                policy = build_megatron_policy(hf_dir, engine, lr=LR, temperature=TEMPERATURE)
                results[name] = _one_step(policy, batch, layout["rows"], layout["owners"])
            if rank == 0:
                torch.save(results, Path(out_dir) / f"case_{index}.pt")
        finally:
            release_parallel_state()
    if world_size == 2:
        compat.initialize_model_parallel(1, 1, gloo_groups=False)
        try:
            refused = _refusals()
        finally:
            release_parallel_state()
        if rank == 0:
            torch.save(refused, Path(out_dir) / "refusals.pt")


def _refusals() -> list[str]:
    """What ``check_model`` says of a TP 1 fp32 Qwen2 ``GPTModel`` checked against a TP 2
    layout, a Llama layout (no q/k/v biases), a vocabulary padded to 16 (112 rows, not 104) and
    ``engine.dtype=bfloat16``."""
    model = megatron_gpt(tiny_layout("qwen2"))
    wrong = [
        (tiny_layout("qwen2", tp=2), "float32"),
        (tiny_layout("llama"), "float32"),
        (
            MegatronLayout.from_hf_config(hf_config("qwen2"), make_vocab_size_divisible_by=16),
            "float32",
        ),
        (tiny_layout("qwen2"), "bfloat16"),
    ]
    messages = []
    for layout, dtype in wrong:
        try:
            check_model(model, layout, dtype)
        except ValueError as error:
            messages.append(str(error))
    return messages


def _one_step(policy, batch, rows, owners) -> dict:
    """``token_stats`` of the whole batch under the layout, the entropy gradient's
    ``⟨g, g⟩`` (``capture_entropy_gradient``), then one optimizer step (a policy-gradient loss
    with an entropy bonus, as a share of the batch's token mean; its two metric sums): the
    statistics, ``⟨g, g⟩``, the step's result, the clipped gradient it applied and the weights
    after it (Hugging Face names)."""
    if rows is None:
        layout = None
    else:
        micros = tuple(tuple(r) for r in rows)
        layout = MicroBatchLayout(micros, tuple(owners), policy.data_parallel_size)
    stats = policy.token_stats(batch, sums=VOCAB_SUMS, layout=layout)
    if rows is None:
        micros = batch.split(policy.config.micro_batch_size)
    else:
        micros = [batch.select(r) for r in rows]
    count = batch.n_response_tokens

    def loss_fn(index, with_grad):
        micro = micros[index]
        mask = micro.response_mask
        logprob = (with_grad.logprob * mask).sum()
        entropy = (with_grad.entropy * mask).sum()
        gain = (micro.advantages * with_grad.logprob * mask).sum()
        loss = -(gain + ENTROPY_BONUS * entropy) / count
        return LossOutput(loss, {"logprob": logprob, "entropy": entropy})

    def entropy_fn(index, with_grad):
        return LossOutput((with_grad.entropy * micros[index].response_mask).sum() / count, {})

    gradient = policy.capture_entropy_gradient(micros, entropy_fn, owners)
    squared, _ = gradient.inner_products()
    with main_grads_at_steps(policy) as steps:
        result = policy.train_step(micros, loss_fn, SUM_NAMES, owners)
    (grads, norm), clip = steps[0], policy.config.grad_clip
    return {
        "stats": {field: getattr(stats, field) for field in STAT_FIELDS},
        "entropy_grad_squared": squared,
        "skipped": result.skipped,
        "grad_norm": result.grad_norm,
        "sums": result.sums,
        "grads": hf_names(policy.layout, clipped(grads, norm, clip)),
        "weights": {name: tensor.clone() for name, tensor in policy.named_weights()},
    }
