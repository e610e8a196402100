"""Which direction should ``entropy_neutral`` correct the update along? Euclidean ``∇θ H̄`` against
AdamW's preconditioned ``∇θ H̄ / (√v̂ + ε)``, on the demo's warm-started model.

One strict GRPO step of the ``hf`` engine on a fixed batch (the demo's first 32 training
problems, 8 worked solutions each with the demo's slip rate, scored by the task's verifier), then
the update ``Δθ`` it applied corrected along ``d`` so that ``⟨∇θ H̄, Δθ'⟩ = 0``
(``α = −⟨g, Δθ⟩ / ⟨g, d⟩``), for each ``d``; printed per learning rate: strict GRPO's realized
change of the batch's token-mean entropy, each direction's realized residual (and its share of
GRPO's), and the corrected update's norm over the uncorrected one. ``--earlier-steps k`` first
takes ``k`` strict GRPO steps on other batches, so that AdamW's second moment ``v`` is not
just the first step's squared gradient.

    .venv/bin/python benchmarks/correction_direction.py --lr 5e-6 2.5e-6
    .venv/bin/python benchmarks/correction_direction.py --lr 5e-6 --earlier-steps 10
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
from pathlib import Path

import torch

from opefo_nemo.config import load_method
from opefo_nemo.config.compose import compose
from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core import group_advantages
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.engines.batch import TrainBatch, build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.models.tiny import EOS_ID, PAD_ID, encode
from opefo_nemo.models.transformers_compat import load_causal_lm
from opefo_nemo.tasks.arithmetic import (
    make_problems,
    operands,
    score_final_answer,
    worked_solution,
)
from opefo_nemo.trainer.setup import embedded_model
from opefo_nemo.trainer.update import realized_entropy_change, update_rollout_batch

PROMPTS, RESPONSES, MICRO, SLIP_RATE = 32, 8, 64, 0.3


def _batch(model_dir: Path, block: int) -> TrainBatch:
    """Training problems ``32·block … 32·block + 31`` of the demo, 8 worked solutions each."""
    train, _ = make_problems(2, PROMPTS * (block + 1), 64, seed=1234)
    codec, rng = PromptCodec(model_dir, "raw"), random.Random(block)
    prompts, responses, rewards = [], [], []
    for problem in train[PROMPTS * block :]:
        a, b = operands(problem.problem)
        for _ in range(RESPONSES):
            text = worked_solution(a, b, SLIP_RATE, rng)
            prompts.append(codec.encode(problem))
            responses.append([*encode(text), EOS_ID])
            rewards.append(score_final_answer(text, problem.ground_truth).score)
    groups = torch.arange(len(rewards)) // RESPONSES
    advantages = group_advantages(torch.tensor(rewards), groups, True, False)
    return build_batch(prompts, responses, advantages, PAD_ID)


def _entropy_gradient(model: torch.nn.Module, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """``∇θ H̄`` of the batch's token-mean entropy (temperature 1) at ``model``'s weights."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        copy = load_causal_lm(Path(tmp), torch.float32)
    logits = copy(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    mask = batch.response_mask
    ((entropy * mask).sum() / mask.sum()).backward()
    return {name: p.grad.detach() for name, p in copy.named_parameters()}


def _dot(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.fsum(float((a[k].double() * b[k].double()).sum()) for k in a)


def _measure(model_dir: Path, lr: float, earlier_steps: int) -> None:
    engine = EngineConfig(warmup_steps=0, micro_batch_size=MICRO)
    policy = HFPolicy(model_dir, engine, lr=lr, temperature=1.0)
    grpo = build_objective(load_method("grpo_strict", [f"lr={lr}"]))
    for block in range(1, earlier_steps + 1):
        update_rollout_batch(policy, grpo, _batch(model_dir, block), MICRO, 0)
    batch = _batch(model_dir, 0)
    grad = _entropy_gradient(policy.model, batch)
    named = dict(policy.model.named_parameters())
    start = {n: p.detach().clone() for n, p in named.items()}
    outcome = update_rollout_batch(policy, grpo, batch, MICRO, 0)
    after = {n: p.detach().clone() for n, p in named.items()}
    grpo_change = realized_entropy_change(policy, batch, outcome.entropy_before)
    step = {n: after[n].double() - start[n].double() for n in named}
    names = {p: n for n, p in named.items()}
    second_moment = {names[p]: s["exp_avg_sq"] for p, s in policy.optimizer.state.items()}
    steps = {names[p]: float(s["step"]) for p, s in policy.optimizer.state.items()}
    beta2, eps = engine.adam_beta2, engine.adam_eps
    preconditioned = {
        n: grad[n] / ((second_moment[n] / (1 - beta2 ** steps[n])).sqrt() + eps) for n in grad
    }
    print(
        f"lr {lr:g}, {earlier_steps} earlier step(s): strict GRPO changes H̄ by {grpo_change:+.3e}"
    )
    for label, direction in (("euclidean", grad), ("adam-preconditioned", preconditioned)):
        alpha = -_dot(grad, step) / _dot(grad, direction)
        with torch.no_grad():
            for n, p in named.items():
                p.copy_(after[n] + alpha * direction[n])
        residual = realized_entropy_change(policy, batch, outcome.entropy_before)
        moved = {n: step[n] + alpha * direction[n].double() for n in step}
        ratio = math.sqrt(_dot(moved, moved) / _dot(step, step))
        print(
            f"  d = {label:20s} residual {residual:+.3e} ({abs(residual / grpo_change):.2%} of "
            f"GRPO's), ‖Δθ'‖ / ‖Δθ‖ = {ratio:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lr", type=float, nargs="+", default=[5e-6, 2.5e-6])
    parser.add_argument("--earlier-steps", type=int, default=0)
    parser.add_argument("--model", default=None, help="default: the embedded warm-started model")
    args = parser.parse_args()
    model_dir = Path(args.model) if args.model else embedded_model(compose([])[0])
    for lr in args.lr:
        _measure(model_dir, lr, args.earlier_steps)


if __name__ == "__main__":
    main()
