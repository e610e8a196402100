"""The ``run``, ``trainer`` and ``checkpoint`` sections (``conf/config.yaml``): what is trained,
how long, and where it goes. Each field's default is the key's default, its docstring its meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

from opefo_nemo.core.schema import require

SEEDS_PER_STEP = 10_000
"""The sampling seeds each rollout step owns, one per response (``trainer/seeds.py``,
``sampling_seed``): a step may sample at most this many responses."""


@dataclass(frozen=True)
class RunConfig:
    name: str = "${method.name}"
    """Run name: progress bar, W&B, default output directory (default: the method's name)."""
    output_dir: str = "outputs/${run.name}"
    """``metrics.jsonl``, ``tensorboard/`` and ``checkpoints/`` go here."""
    seed: int = 0
    """Seeds prompt order, rollout sampling and Clip-Cov's random subset."""
    seeds: tuple[int, ...] = ()
    """Several seeds, e.g. ``[0,1,2]``: every run is trained once per seed (>= 0, none twice) from
    the same start into ``<output_dir>[/<method>]/seed_<s>``, then the report over them is
    written; replaces ``run.seed``. ``[]``: ``run.seed`` only."""
    compare: tuple[str, ...] = ()
    """Methods to train one after another from the same start, into ``<output_dir>/<method>``,
    then a comparison report (``report.png``, ``summary.md``); empty: train ``method`` only."""

    def validate(self) -> None:
        """Seeds non-negative, no seed twice; no method twice in ``run.compare`` (each run has
        its own output directory)."""
        require(self.seed >= 0, "run.seed", f"({self.seed}) must be >= 0")
        negative = [s for s in self.seeds if s < 0]
        require(not negative, "run.seeds", f"must be >= 0, got {negative}")
        twice = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        require(not twice, "run.seeds", f"lists seed(s) {twice} more than once")
        repeated = sorted({m for m in self.compare if self.compare.count(m) > 1})
        require(not repeated, "run.compare", f"lists method(s) {repeated} more than once")


@dataclass(frozen=True)
class TrainerConfig:
    max_steps: int = 80
    """Rollout steps to train."""
    prompts_per_step: int = 16
    """Prompts per rollout step (paper: 32)."""
    responses_per_prompt: int = 8
    """K responses per prompt, one GRPO group (paper: 8)."""
    max_nan_steps: int = 3
    """Abort after this many rollout steps in a row with a NaN loss or gradient."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (spec §4): drop the groups whose rewards are all equal and
    generate more rounds of ``prompts_per_step`` prompts with the same weights until the step
    holds ``prompts_per_step`` groups with signal (the first ones, in the order they were
    sampled) or ``dynamic_sampling_max_rounds`` rounds have run; then train on what there is
    (nothing at all: the step makes no update)."""
    dynamic_sampling_max_rounds: int = 4
    """Generation rounds per rollout step with ``dynamic_sampling``, the first included (>= 1;
    1: filter without generating more); round ``r`` uses the step's sampling seeds
    ``r × prompts_per_step × responses_per_prompt`` further on, so rounds × prompts × responses
    must stay <= 10000 (the seeds a step owns)."""

    def validate(self) -> None:
        require(self.max_steps >= 0, "trainer.max_steps", "must be >= 0")
        require(self.prompts_per_step >= 1, "trainer.prompts_per_step", "must be >= 1")
        require(
            self.responses_per_prompt >= 2,
            "trainer.responses_per_prompt",
            "must be >= 2 (a group of one has advantage 0, spec §4)",
        )
        require(self.max_nan_steps >= 1, "trainer.max_nan_steps", "must be >= 1")
        require(
            self.dynamic_sampling_max_rounds >= 1,
            "trainer.dynamic_sampling_max_rounds",
            "must be >= 1 (the first generation round counts)",
        )
        if self.dynamic_sampling:
            responses = self.prompts_per_step * self.responses_per_prompt
            require(
                self.dynamic_sampling_max_rounds * responses <= SEEDS_PER_STEP,
                "trainer.dynamic_sampling_max_rounds",
                f"({self.dynamic_sampling_max_rounds}) × trainer.prompts_per_step × "
                f"trainer.responses_per_prompt ({responses}) must be at most {SEEDS_PER_STEP}: "
                "the sampling seeds of a step's last round would reach the next step's",
            )


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10
    """Checkpoint every N rollout steps (0: only at the end); also on SIGTERM / SIGUSR1, after
    the current step, then exit."""
    resume: str = "auto"
    """Where a run starting into ``run.output_dir`` begins: ``auto`` (its newest checkpoint, else
    step 0), ``fresh`` (step 0; a directory holding a run is refused), ``latest`` (the newest
    checkpoint, which must exist) or a checkpoint directory (``trainer/checkpoint.py``)."""
    keep: int = 2
    """How many checkpoints to keep."""

    def validate(self) -> None:
        require(self.every >= 0, "checkpoint.every", "must be >= 0 (0 = only at end)")
        require(self.keep >= 1, "checkpoint.keep", "must be >= 1")
        require(
            bool(self.resume),
            "checkpoint.resume",
            "must be auto, fresh, latest or a checkpoint directory",
        )
