"""Spawned ranks of the multi-rank loop tests (``test_loop_spmd_vllm.py``).

Each rank runs the real :class:`Trainer` with the real ``HFPolicy`` (replicated: every rank holds
the same model and gets the same batch, so the ranks' updates are identical without any gradient
communication) and a real :class:`ColocatedRollout` over real vLLM CPU servers.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from opefo_nemo.config.compose import compose
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.launch.placement import ColocatedPlacement
from opefo_nemo.orchestration.colocated_rollout import ColocatedRollout
from opefo_nemo.orchestration.ranks import LoopRanks
from opefo_nemo.rollout import SamplingConfig, VLLMRolloutEngine
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.setup import load_datasets, start_colocated_rollout


def one_server_per_group(
    ranks: LoopRanks, config, model: Path, weights, group_size: int
) -> ColocatedRollout:
    """One TP-1 vLLM server per ``group_size`` ranks, of the kind the single-process reference
    uses: the other ranks of a group own none and only walk the weight stream."""

    def start(placement: ColocatedPlacement, index: int) -> VLLMRolloutEngine:
        return VLLMRolloutEngine(
            model,
            seed=config.run.seed,
            max_model_len=max(config.data.max_prompt_tokens + config.rollout.max_new_tokens, 64),
            dtype=config.engine.dtype,
        )

    placement = ColocatedPlacement(ranks.world_size, ranks.local_world_size, group_size)
    return ColocatedRollout(ranks, placement, start, weights, config.rollout.max_restarts)


def _trainer(
    ranks: LoopRanks, overrides: list[str], out: Path, rollout: ColocatedRollout | None
) -> Trainer:
    config, config_dict = compose(overrides)
    model = Path(config.model.path)
    policy = HFPolicy(model, config.engine, lr=config.method.lr, temperature=1.0)
    codec = PromptCodec(model, config.data.template)
    train, validation = load_datasets(config, codec)
    if rollout is None:  # one server for both ranks
        rollout = one_server_per_group(ranks, config, model, policy.named_weights, 2)
    rollout.weights = policy.named_weights
    rollout.update_weights(policy.named_weights())
    trainer = Trainer(config, config_dict, policy, rollout, codec, train, validation, out, ranks)
    trainer.resume(config.checkpoint.resume)
    return trainer


def _signal_at_second_rollout(trainer) -> None:
    """Rank 1 only: SIGUSR1 to itself when step 2 starts generating (its second ``generate``
    call), so the signal arrives during step 2 whatever the machine's speed."""
    generate, calls = trainer.rollout.generate, []

    def generate_then_signal(*args, **kwargs):
        calls.append(None)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
        return generate(*args, **kwargs)

    trainer.rollout.generate = generate_then_signal


def preempt_and_resume(rank: int, world_size: int, overrides: list[str], out: str) -> None:
    """Run to ``trainer.max_steps`` = 3; rank 1 alone gets SIGUSR1 during step 2; the ranks must
    stop together and checkpoint; a second trainer resumes from that checkpoint and finishes."""
    ranks = LoopRanks(rank, world_size, world_size)
    out_dir = Path(out)
    first = _trainer(ranks, overrides, out_dir, None)
    if rank == 1:
        _signal_at_second_rollout(first)
    status = first.run()
    stops = ranks.gather((status, first.step))
    second = _trainer(ranks, [*overrides, "checkpoint.resume=latest"], out_dir, first.rollout)
    resumed_at = second.step
    final = second.run()
    second.rollout.close()
    report = {"stops": stops, "resumed_at": resumed_at, "final": (final, second.step)}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))


def shared_generation(rank: int, world_size: int, overrides: list[str], out: str) -> None:
    """Two servers (one per rank) started by ``start_colocated_rollout``: greedy and seeded
    completions of every prompt, written by rank 0 for the test to compare; then rank 1's
    server is killed and the next request must restart it and still answer; killed again, the
    request must fail on every rank, naming rank 1 (``rollout.max_restarts`` = 1)."""
    ranks = LoopRanks(rank, world_size, world_size)
    config, _ = compose(overrides)
    model = Path(config.model.path)
    policy = HFPolicy(model, config.engine, lr=config.method.lr, temperature=1.0)
    rollout = start_colocated_rollout(config, model, policy.named_weights, ranks)
    rollout.update_weights(policy.named_weights())
    codec = PromptCodec(model, config.data.template)
    prompts = load_datasets(config, codec)[0].prompts[:5]
    seeded = SamplingConfig(
        temperature=1.0, max_new_tokens=8, seed=123, stop_token_ids=(codec.eos_id,)
    )
    results = {
        "greedy": rollout.generate(prompts, 1, SamplingConfig(0.0, max_new_tokens=8)),
        "seeded": rollout.generate(prompts, 3, seeded),
    }
    if rank == 1:
        os.kill(rollout.local.server_pids[0], signal.SIGKILL)
    results["after_restart"] = rollout.generate(prompts, 3, seeded)
    results["restarts"] = rollout.restarts
    if rank == 1:
        os.kill(rollout.local.server_pids[0], signal.SIGKILL)
    try:
        rollout.generate(prompts, 1, seeded)
    except RuntimeError as error:
        results["second_death"] = str(error)
    every_rank = ranks.gather(results)
    rollout.close()
    if rank == 0:
        (Path(out) / "spmd.json").write_text(
            json.dumps(
                {
                    "prompts": prompts,
                    "ranks_agree": all(r == every_rank[0] for r in every_rank),
                    **{
                        key: [[c.prompt_index, c.token_ids] for c in value]
                        for key, value in results.items()
                        if key in ("greedy", "seeded", "after_restart")
                    },
                    "restarts": [r["restarts"] for r in every_rank],
                    "second_death": [r.get("second_death") for r in every_rank],
                }
            )
        )
