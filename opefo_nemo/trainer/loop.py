"""The GRPO / OPEFO training loop, one rollout step at a time: ``Trainer.train_step`` reads top to
bottom as the algorithm, ``Trainer.run`` adds checkpoints, validation, the NaN guard and
pre-emption (docs/training.md, "The loop"; docs/architecture.md)."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opefo_nemo.config.train import TrainConfig
from opefo_nemo.core import group_advantages
from opefo_nemo.core.advantages import signal_fraction
from opefo_nemo.core.metrics import EntropyDrift, RunningCorrelation, rollout_metrics, rollout_sums
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.data import Problem
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.data.stop_tokens import stop_tokens
from opefo_nemo.engines.batch import TrainBatch, build_batch
from opefo_nemo.engines.hf_generation import HFGenerator
from opefo_nemo.engines.protocols import Policy
from opefo_nemo.eval import sample_metrics
from opefo_nemo.orchestration.colocated_rollout import ColocatedRollout
from opefo_nemo.orchestration.ranks import SINGLE_PROCESS, LoopRanks
from opefo_nemo.orchestration.refit import refit_rollout
from opefo_nemo.orchestration.rollout_guard import GuardedRollout
from opefo_nemo.parallel import NonFiniteLogitsError
from opefo_nemo.rollout import SamplingConfig
from opefo_nemo.trainer.checkpoint import (
    CHECKPOINTS_SUBDIR,
    load_checkpoint,
    resume_point,
    save_checkpoint,
)
from opefo_nemo.trainer.dynamic_sampling import ScoredRound, sample_step
from opefo_nemo.trainer.metrics_log import MetricsLogger
from opefo_nemo.trainer.nan_guard import NanGuard
from opefo_nemo.trainer.sampler import PromptSampler
from opefo_nemo.trainer.scoring import overlong_penalties, reason_metrics, score_responses
from opefo_nemo.trainer.seeds import sampling_seed, step_seed
from opefo_nemo.trainer.update import (
    RolloutUpdateSummary,
    predicted_change,
    realized_entropy_change,
    update_rollout_batch,
)
from opefo_nemo.trainer.update_layout import prompt_and_response_tokens

log = logging.getLogger(__name__)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclass(frozen=True)
class CollectedRollout:
    """One step's generated batch: the training batch of the kept groups (advantages included;
    ``None``: none kept), the rollout metrics (reward, length, verifier outcomes, share of groups
    with signal, dynamic sampling's counts, time) and, per row of the batch, its group (``0, 1,
    ...`` in the order kept), the verifier's verdict and the reward."""

    batch: TrainBatch | None
    metrics: dict[str, float]
    group_ids: torch.Tensor
    correct: torch.Tensor
    rewards: torch.Tensor


@dataclass
class Dataset:
    """Problems with their encoded prompts (over-long ones already skipped)."""

    problems: list[Problem]
    prompts: list[list[int]]


class Trainer:
    """Owns the loop state: step, prompt sampler, the method's objective (and its state), NaN
    streak; talks to the engines by protocol."""

    def __init__(
        self,
        config: TrainConfig,
        config_dict: dict[str, Any],
        policy: Policy,
        rollout: GuardedRollout | ColocatedRollout | HFGenerator,
        codec: PromptCodec,
        train: Dataset,
        validation: Dataset | None,
        output_dir: Path,
        ranks: LoopRanks = SINGLE_PROCESS,
        attention_width: int | None = None,
    ):
        self.config = config
        self.attention_width = attention_width  # ModelShape.attention_width (spec §11)
        self.ranks = ranks
        self.config_dict = config_dict
        self.policy = policy
        self.rollout = rollout
        self.codec = codec
        self.train = train
        self.validation = validation
        self.output_dir = output_dir
        self.checkpoint_dir = output_dir / CHECKPOINTS_SUBDIR
        self.step = 0
        self.trained_rows: tuple[list[int], list[int]] | None = None  # for lengths.jsonl
        self.objective = build_objective(config.method)
        self.flow_predictor = RunningCorrelation()
        self.entropy_drift = EntropyDrift()
        self.nan_guard = NanGuard(config.trainer.max_nan_steps)
        self.sampler = PromptSampler(
            len(train.problems), config.trainer.prompts_per_step, config.run.seed
        )
        self._stop_signal: int | None = None
        self.stop = stop_tokens(codec, config.rollout.stop_token_ids)
        if ranks.is_main:
            log.info("generation stops at token ids %s", self.stop.describe(codec))

    def collect(self) -> CollectedRollout:
        """The rollout half of a step: sample this step's prompts, generate K responses each,
        score them (more rounds with ``trainer.dynamic_sampling``, :mod:`.dynamic_sampling`)
        and form the training batch of the kept groups with their advantages (spec §4). The
        rollout metrics are over every response generated; ``batch`` is ``None`` when no group
        was kept."""
        cfg = self.config
        start = time.perf_counter()
        sample = sample_step(self._generate_round, cfg.trainer, cfg.method.updates_per_rollout)
        every, kept = sample.generated(), sample.training()
        lengths = torch.tensor([len(c.token_ids) for c in every.completions])
        truncated = torch.tensor([c.finish_reason == "length" for c in every.completions])
        metrics = rollout_metrics(rollout_sums(every.rewards, lengths, truncated))
        metrics.update(reason_metrics(every.results))
        metrics["reward/group_signal_frac"] = signal_fraction(every.rewards, every.group_ids)
        if cfg.reward.overlong_buffer:
            metrics["reward/overlong_penalty"] = sum(every.penalties) / every.rows
        metrics.update(sample.metrics())
        if sample.dynamic and len(sample.kept) < cfg.trainer.prompts_per_step:
            log.warning(
                "step %d: %d of trainer.prompts_per_step=%d groups with signal after %d "
                "round(s) (trainer.dynamic_sampling_max_rounds)%s",
                self.step,
                len(sample.kept),
                cfg.trainer.prompts_per_step,
                len(sample.rounds),
                "" if sample.kept else ": no update this step",
            )
        batch = None
        if kept.rows:
            a = cfg.advantage
            advantages = group_advantages(
                kept.rewards, kept.group_ids, a.normalize_std, a.leave_one_out
            )
            batch = build_batch(
                kept.prompts,
                [c.token_ids for c in kept.completions],
                advantages,
                self.codec.pad_id,
                [c.logprobs for c in kept.completions],
            )
        rollout_s = sum(r.generate_s for r in sample.rounds)
        metrics["time/rollout_s"] = rollout_s
        metrics["time/reward_s"] = time.perf_counter() - start - rollout_s
        correct = torch.tensor([r.correct for r in kept.results], dtype=torch.bool)
        return CollectedRollout(batch, metrics, kept.group_ids, correct, kept.rewards)

    def _generate_round(self, round_index: int) -> ScoredRound:
        """The next ``trainer.prompts_per_step`` prompts of the sampler, K responses each with
        the current weights and round ``round_index``'s seeds, scored."""
        cfg, k = self.config, self.config.trainer.responses_per_prompt
        indices = self.sampler.next_batch()
        prompts = [self.train.prompts[i] for i in indices]
        start = time.perf_counter()
        completions = self.rollout.generate(prompts, k, self._sampling(self.step, round_index))
        generate_s = time.perf_counter() - start
        responses = [self.codec.decode(c.token_ids) for c in completions]
        truths = [self.train.problems[indices[c.prompt_index]].ground_truth for c in completions]
        results = self.ranks.on_main(lambda: score_responses(responses, truths, cfg.reward))
        lengths = [len(c.token_ids) for c in completions]
        penalties = overlong_penalties(lengths, cfg.reward, cfg.rollout.max_new_tokens)
        rewards = torch.tensor(
            [r.score + p for r, p in zip(results, penalties, strict=True)], dtype=torch.float32
        )
        return ScoredRound(prompts, completions, results, penalties, rewards, generate_s)

    def train_step(self) -> dict[str, float]:
        """One rollout step; returns its metrics (the step counter is advanced by the caller).
        A step that kept no group (dynamic sampling) changes nothing: no update, no advance of
        the learning-rate schedule, no refit."""
        timings = {}
        start = time.perf_counter()
        collected = self.collect()
        mark = time.perf_counter()
        metrics: dict[str, float] = {}
        outcome = RolloutUpdateSummary({}, 0, float("nan"))
        self.trained_rows = None
        if collected.batch is not None:
            self.trained_rows = prompt_and_response_tokens(collected.batch)
            self.rollout.sleep()  # its GPU memory goes to the update (no-op on CPU servers)
            outcome, metrics = self._update(collected.batch)
            self.policy.advance_schedule()
        drift = self.entropy_drift.step(outcome.entropy_before, metrics.get("flow/realized"))
        if drift is not None:
            metrics["flow/drift"] = drift
        timings["time/update_s"] = time.perf_counter() - mark

        mark = time.perf_counter()
        if collected.batch is not None:
            refit_rollout(self.rollout, self.policy)
        timings["time/weight_sync_s"] = time.perf_counter() - mark

        self.nan_guard.record(self.step, outcome.skipped_steps)
        metrics.update(collected.metrics)
        metrics.update(timings)
        metrics["train/skipped_updates"] = float(outcome.skipped_steps)
        metrics["data/epoch"] = float(self.sampler.epoch)
        metrics["time/step_s"] = time.perf_counter() - start
        return metrics

    def _update(self, batch: TrainBatch) -> tuple[RolloutUpdateSummary, dict[str, float]]:
        """The update of the rollout batch, and its metrics with ``flow/realized`` on the
        steps ``metrics.realized_every`` measures."""
        cfg, engine = self.config, self.config.engine
        try:
            outcome = update_rollout_batch(
                self.policy,
                self.objective,
                batch,
                engine.micro_batch_size,
                seed=self.update_seed(),
                batch_layout=engine.batch_layout,
                max_tokens_per_micro_batch=engine.max_tokens_per_micro_batch,
                attention_width=self.attention_width,
                fidelity_threshold=cfg.metrics.fidelity_threshold,
                confident_prob=cfg.metrics.confident_prob,
            )
        except NonFiniteLogitsError as error:
            log.warning("step %d: non-finite logits in the token-stats pass (%s)", self.step, error)
            outcome = RolloutUpdateSummary({}, cfg.method.updates_per_rollout, float("nan"))
        metrics = dict(outcome.metrics)
        every = cfg.metrics.realized_every
        if every and (self.step + 1) % every == 0 and not outcome.skipped_steps:
            metrics["flow/realized"] = realized_entropy_change(
                self.policy, batch, outcome.entropy_before
            )
            metrics.update(self._predictor_quality(outcome, metrics["flow/realized"]))
        return outcome, metrics

    def update_seed(self) -> int:
        """The seed of this step's update (a method's randomness: Clip-Cov's subset)."""
        return step_seed(self.config.run.seed, self.step)

    def _predictor_quality(
        self, outcome: RolloutUpdateSummary, realized: float
    ) -> dict[str, float]:
        """``flow/predictor_corr``: correlation of the step's :func:`predicted_change` with
        ``flow/realized`` over every measured step so far (steps predicting nothing left out)."""
        predicted = predicted_change(outcome)
        if predicted is not None:
            self.flow_predictor.add(predicted, realized)
        value = self.flow_predictor.value()
        return {} if value is None else {"flow/predictor_corr": value}

    def _sampling(self, step: int, round_index: int = 0) -> SamplingConfig:
        """Seeded per step, so a resumed run samples what the uninterrupted one would have; a
        dynamic sampling round continues the step's seeds where the previous round's end."""
        r, responses = self.config.rollout, self.config.rollout_batch_size
        seed = sampling_seed(self.config.run.seed, step, round_index * responses)
        return r.sampling(self.stop.ids, seed)

    def validate(self) -> dict[str, float]:
        """``val/avg@k`` and ``val/pass@k`` on the validation set with the validation sampling
        (spec §7): ``validation.k`` samples per problem, pass@k at every k of
        :func:`~opefo_nemo.eval.pass_k_sizes` (the powers of two below it, and itself)."""
        if self.validation is None:
            raise ValueError("validation needs data.validation (a file or `arithmetic`)")
        v = self.config.validation
        problems, prompts = self.validation.problems, self.validation.prompts
        if v.max_problems is not None:
            problems, prompts = problems[: v.max_problems], prompts[: v.max_problems]
        sampling = SamplingConfig(
            temperature=v.temperature,
            top_p=v.top_p,
            max_new_tokens=self.config.rollout.max_new_tokens,
            stop_token_ids=self.stop.ids,
            seed=self.config.run.seed,
        )
        completions = self.rollout.generate(prompts, v.k, sampling)
        responses = [self.codec.decode(c.token_ids) for c in completions]
        truths = [problems[c.prompt_index].ground_truth for c in completions]
        results = self.ranks.on_main(lambda: score_responses(responses, truths, self.config.reward))
        matrix = [
            [float(results[i * v.k + j].correct) for j in range(v.k)] for i in range(len(problems))
        ]
        return {f"val/{name}": value for name, value in sample_metrics(matrix).items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler.state_dict(),
            "method": self.objective.state_dict(),
            "flow_predictor": self.flow_predictor.state_dict(),
            "entropy_drift": self.entropy_drift.state_dict(),
            "nan_streak": self.nan_guard.streak,
            "rollout_restarts": self.rollout.restarts,
        }

    def save(self) -> Path:
        path = save_checkpoint(
            self.checkpoint_dir,
            self.step,
            self.policy,
            self.state_dict(),
            self.config_dict,
            self.config.checkpoint.keep,
            self.ranks,
        )
        if self.ranks.is_main:
            log.info("checkpoint written: %s", path)
        return path

    def resume(self, resume: str) -> Path | None:
        """Restore the checkpoint ``checkpoint.resume`` selects for this run's directory
        (:func:`.checkpoint.resume_point`) and load its weights into the rollout engine;
        ``None``: the run starts at step 0."""
        path = self.ranks.on_main(lambda: resume_point(resume, self.output_dir))
        if path is None:
            return None
        state = load_checkpoint(path, self.policy, self.ranks)
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.objective.load_state_dict(state.get("method", {}))
        if "flow_predictor" in state:
            self.flow_predictor.load_state_dict(state["flow_predictor"])
        if "entropy_drift" in state:
            self.entropy_drift.load_state_dict(state["entropy_drift"])
        self.nan_guard.streak = int(state["nan_streak"])
        self.rollout.update_weights(self.policy.named_weights())
        log.info("resumed from %s at step %d", path, self.step)
        return path

    def run(self) -> str:
        """Train to ``trainer.max_steps``; returns ``"done"`` or ``"preempted"`` (checkpointed)."""
        cfg = self.config
        previous = {s: signal.signal(s, self._on_signal) for s in PREEMPTION_SIGNALS}
        logger = (
            MetricsLogger(
                self.output_dir,
                cfg.metrics,
                cfg.run.name,
                cfg.trainer.max_steps,
                self.step,
                self.config_dict,
            )
            if self.ranks.is_main
            else None
        )
        v_every = cfg.validation.every if self.validation is not None else 0
        start_step, saved_step = self.step, None
        try:
            if v_every and self.step == 0:  # the warm start's, to compare the run with its start
                warm_start = self.validate()
                if logger is not None:
                    logger.log(0, warm_start)
            while self.step < cfg.trainer.max_steps:
                metrics = self.train_step()
                self.step += 1
                if v_every and self.step % v_every == 0:
                    metrics.update(self.validate())
                if logger is not None:
                    logger.log(self.step, metrics)
                    if self.trained_rows is not None:
                        logger.log_lengths(self.step, *self.trained_rows)
                every = cfg.checkpoint.every
                if every and self.step % every == 0:
                    self.save()
                    saved_step = self.step
                if self.ranks.any(self._stop_signal is not None):
                    log.warning(
                        "pre-emption signal (here: %s): checkpointing at step %d and exiting",
                        self._stop_signal,
                        self.step,
                    )
                    if saved_step != self.step:
                        self.save()
                    return "preempted"
            # A run that trained no step (trainer.max_steps=0, a node check; or resumed at its
            # end) has nothing new to save.
            if self.step > start_step and saved_step != self.step:
                self.save()
            return "done"
        finally:
            if logger is not None:
                logger.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stop_signal = signum
