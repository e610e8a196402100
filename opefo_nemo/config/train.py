"""The trainer's configuration (``conf/config.yaml`` and its groups) as validated dataclasses.

:func:`TrainConfig.from_mapping` is the only way in: an unknown key, a wrong type, an impossible
value or a contradiction between sections fails at start-up with an error naming the key. The
meaning of every key is documented beside it in the YAML files under ``conf/``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.objectives import MethodConfig, method_config
from ..core.schema import build, one_of, require
from ..models.packaged import PACKAGED_MODELS
from ..models.shape import ModelShape
from ..models.tiny import ALPHABET
from .engines import ENGINE_CONFIGS, EngineConfig, MegatronEngineConfig

VERIFIERS = ("arithmetic", "last_number", "dapo", "answer", "math_verify")
GENERATED_DATA = ("arithmetic", "word_arithmetic")
"""``data.train`` / ``data.validation`` values that name a built-in task instead of a file."""
LONG_PROMPT_POLICIES = ("skip", "error")


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    output_dir: str = "outputs/run"
    seed: int = 0
    seeds: tuple[int, ...] = ()
    compare: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    embedded: bool = False
    packaged: str | None = None
    warm_start_steps: int = 300
    warm_start_lr: float = 3e-3
    warm_start_batch_size: int = 32
    warm_start_slip_rate: float = 0.0
    warm_start_slips: tuple[int, ...] = (-2, -1, 1, 2)
    warm_start_swap_rate: float = 0.0
    warm_start_carry_first_rate: float = 0.0
    warm_start_zero_carry_rate: float = 0.0
    warm_start_separators: str = ""
    warm_start_separator_rate: float = 0.0
    warm_start_seed: int = 0


@dataclass(frozen=True)
class ArithmeticConfig:
    digits: int = 2
    num_train: int = 2000
    num_validation: int = 64
    seed: int = 1234


@dataclass(frozen=True)
class DataConfig:
    train: str = "arithmetic"
    validation: str | None = None
    template: str = "raw"
    max_prompt_tokens: int = 512
    long_prompt: str = "skip"
    # a file row with an empty or missing problem or answer: `error` refuses the file naming every
    # such row, `skip` reads the others and warns with the count and the rows (data/loaders.py)
    defective_rows: str = "error"
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)

    def validate(self) -> None:
        one_of(self.defective_rows, ("error", "skip"), "data.defective_rows")


@dataclass(frozen=True)
class RolloutConfig:
    name: str = "vllm"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    num_servers: int = 1
    max_restarts: int = 1
    gpu_memory_utilization: float = 0.5
    python: str | None = None
    startup_timeout_s: float = 300.0
    stop_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TrainerConfig:
    max_steps: int = 20
    prompts_per_step: int = 8
    responses_per_prompt: int = 8
    max_nan_steps: int = 3


@dataclass(frozen=True)
class AdvantageConfig:
    normalize_std: bool = True
    leave_one_out: bool = False


@dataclass(frozen=True)
class RewardSettings:
    verifier: str = "arithmetic"
    timeout_s: float = 5.0
    workers: int = 0
    incorrect_score: float | None = None
    overlong_buffer: int = 0
    overlong_penalty_factor: float = 1.0

    def validate(self, max_new_tokens: int) -> None:
        """Ranges and contradictions of the ``reward`` keys; errors name the key."""
        one_of(self.verifier, VERIFIERS, "reward.verifier")
        require(self.timeout_s > 0, "reward.timeout_s", "must be > 0")
        require(self.workers >= 0, "reward.workers", "must be >= 0")
        require(
            self.incorrect_score is None or self.incorrect_score < 1.0,
            "reward.incorrect_score",
            f"({self.incorrect_score}) must be below the correct score 1.0, or null",
        )
        require(self.overlong_buffer >= 0, "reward.overlong_buffer", "must be >= 0 (0 = off)")
        require(
            self.overlong_buffer < max_new_tokens,
            "reward.overlong_buffer",
            f"({self.overlong_buffer}) must be below rollout.max_new_tokens ({max_new_tokens})",
        )
        require(self.overlong_penalty_factor >= 0, "reward.overlong_penalty_factor", "must be >= 0")
        require(
            self.overlong_buffer > 0 or self.overlong_penalty_factor == 1.0,
            "reward.overlong_penalty_factor",
            "has no effect while reward.overlong_buffer is 0 (shaping off): set both or neither",
        )


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10
    # where a run starting into run.output_dir begins: `auto` (its newest checkpoint, else step
    # 0), `fresh` (step 0; a directory holding a run is refused), `latest` (the newest checkpoint,
    # which must exist) or a checkpoint directory (trainer/checkpoint.py resume_point)
    resume: str = "auto"
    keep: int = 2

    def validate(self) -> None:
        require(self.every >= 0, "checkpoint.every", "must be >= 0")
        require(self.keep >= 1, "checkpoint.keep", "must be >= 1")
        require(
            bool(self.resume),
            "checkpoint.resume",
            "must be auto, fresh, latest or a checkpoint directory",
        )


@dataclass(frozen=True)
class ValidationConfig:
    every: int = 0
    k: int = 4
    max_problems: int | None = None
    temperature: float = 1.0
    top_p: float = 0.7


@dataclass(frozen=True)
class WandbConfig:
    enabled: bool = False
    project: str = "opefo-nemo"
    mode: str = "offline"


@dataclass(frozen=True)
class MetricsConfig:
    realized_every: int = 0
    fidelity_threshold: float = 0.2
    confident_prob: float = 0.9
    tensorboard: bool = True
    progress: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass(frozen=True)
class TrainConfig:
    """Every section of ``conf/config.yaml``; ``method`` is the settings dataclass of the chosen
    method (a :class:`MethodConfig` subclass, core.objectives)."""

    method: MethodConfig
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    engine: EngineConfig | MegatronEngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    reward: RewardSettings = field(default_factory=RewardSettings)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    @property
    def rollout_batch_size(self) -> int:
        """Responses per rollout step: prompts × K."""
        return self.trainer.prompts_per_step * self.trainer.responses_per_prompt

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from the composed config (a plain dict) and validate; errors name the key."""
        if "method" not in data:
            raise ValueError("missing section method (choose one with method=<name>)")
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise ValueError(f"unknown section {unknown[0]} (known: {', '.join(sorted(hints))})")
        method_data = {k: v for k, v in data["method"].items() if k != "defaults"}
        sections = {
            name: build(_section_type(name, value, hints), value, name)
            for name, value in data.items()
            if name != "method"
        }
        built = cls(method=method_config(method_data, prefix="method"), **sections)
        built.validate()
        return built

    def validate(self) -> None:
        """Ranges and cross-section contradictions (spec §4, §5, §8)."""
        t, e, r = self.trainer, self.engine, self.rollout
        self._validate_run()
        self.checkpoint.validate()
        require(t.max_steps >= 0, "trainer.max_steps", "must be >= 0")
        require(t.prompts_per_step >= 1, "trainer.prompts_per_step", "must be >= 1")
        require(
            t.responses_per_prompt >= 2,
            "trainer.responses_per_prompt",
            "must be >= 2 (a group of one has advantage 0, spec §4)",
        )
        require(t.max_nan_steps >= 1, "trainer.max_nan_steps", "must be >= 1")
        require(
            self.rollout_batch_size % self.method.updates_per_rollout == 0,
            "method.updates_per_rollout",
            f"({self.method.updates_per_rollout}) must divide the rollout batch "
            f"trainer.prompts_per_step × trainer.responses_per_prompt = {self.rollout_batch_size}",
        )
        if isinstance(e, MegatronEngineConfig):
            e.validate()
            shape = _readable_shape(self.model.path)
            if shape is not None:
                e.validate_model(shape, f"model.path={self.model.path}")
        else:
            e.validate()
        one_of(r.name, ("vllm",), "rollout.name")
        require(
            r.temperature > 0,
            "rollout.temperature",
            "must be > 0 (the policy is the temperature-scaled softmax, spec §1)",
        )
        require(
            r.top_p == 1.0 and r.top_k == 0,
            "rollout.top_p",
            "and rollout.top_k must stay 1.0 and 0 for training: the token statistics are of the "
            "full temperature-scaled softmax (spec §1), truncated sampling would be off-policy",
        )
        require(r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
        require(r.num_servers >= 1, "rollout.num_servers", "must be >= 1")
        require(r.max_restarts >= 0, "rollout.max_restarts", "must be >= 0")
        require(
            0 < r.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization", "must be in (0, 1]"
        )
        require(r.python != "", "rollout.python", "is empty: give an interpreter or null")
        require(r.startup_timeout_s > 0, "rollout.startup_timeout_s", "must be > 0")
        require(
            r.stop_token_ids is None or bool(r.stop_token_ids and min(r.stop_token_ids) >= 0),
            "rollout.stop_token_ids",
            "must be null (derived from the model) or a non-empty list of token ids >= 0",
        )
        one_of(self.data.long_prompt, LONG_PROMPT_POLICIES, "data.long_prompt")
        self.data.validate()
        require(self.data.max_prompt_tokens >= 1, "data.max_prompt_tokens", "must be >= 1")
        a = self.data.arithmetic
        require(1 <= a.digits <= 4, "data.arithmetic.digits", "must be in 1..4")
        require(a.num_train >= 1, "data.arithmetic.num_train", "must be >= 1")
        m = self.model
        if m.packaged is not None:
            one_of(m.packaged, tuple(PACKAGED_MODELS), "model.packaged")
            require(not m.embedded, "model.packaged", "and model.embedded=true exclude each other")
        require(m.warm_start_steps >= 1, "model.warm_start_steps", "must be >= 1")
        require(m.warm_start_lr > 0, "model.warm_start_lr", "must be > 0")
        require(m.warm_start_batch_size >= 1, "model.warm_start_batch_size", "must be >= 1")
        require(0 <= m.warm_start_slip_rate < 1, "model.warm_start_slip_rate", "must be in [0, 1)")
        require(
            bool(m.warm_start_slips) and 0 not in m.warm_start_slips,
            "model.warm_start_slips",
            f"must be a non-empty list of non-zero offsets, got {list(m.warm_start_slips)}",
        )
        rates = ("swap", "carry_first", "zero_carry", "separator")
        for key in (f"warm_start_{name}_rate" for name in rates):
            rate = getattr(m, key)
            require(0 <= rate <= 1, f"model.{key}", f"must be in [0, 1], got {rate}")
        require(
            not m.warm_start_separator_rate or bool(m.warm_start_separators),
            "model.warm_start_separators",
            "is empty, but model.warm_start_separator_rate > 0 needs separators to choose from",
        )
        separators = set(m.warm_start_separators)
        require(
            separators <= set(ALPHABET) - set("0123456789+= \n"),
            "model.warm_start_separators",
            f"({m.warm_start_separators!r}) must be characters of the tiny model's alphabet other "
            "than digits, '+', '=' and whitespace",
        )
        self.reward.validate(r.max_new_tokens)
        require(
            self.model.path != "", "model.path", "is empty: set model.path=<HF model directory>"
        )
        require(self.checkpoint.every >= 0, "checkpoint.every", "must be >= 0 (0 = only at end)")
        require(self.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
        require(self.validation.every >= 0, "validation.every", "must be >= 0 (0 = never)")
        require(self.validation.k >= 1, "validation.k", "must be >= 1")
        require(self.metrics.realized_every >= 0, "metrics.realized_every", "must be >= 0")
        require(
            self.metrics.fidelity_threshold > 0, "metrics.fidelity_threshold", "must be > 0 (nats)"
        )
        require(
            0 < self.metrics.confident_prob < 1,
            "metrics.confident_prob",
            f"must lie in (0, 1) (a probability), got {self.metrics.confident_prob}",
        )
        one_of(self.metrics.wandb.mode, ("offline", "online", "disabled"), "metrics.wandb.mode")

    def _validate_run(self) -> None:
        """``run.seed`` / ``run.seeds``: non-negative, no seed twice; no method twice in
        ``run.compare`` (each run has its own output directory)."""
        run = self.run
        require(run.seed >= 0, "run.seed", f"({run.seed}) must be >= 0")
        negative = [s for s in run.seeds if s < 0]
        require(not negative, "run.seeds", f"must be >= 0, got {negative}")
        twice = sorted({s for s in run.seeds if run.seeds.count(s) > 1})
        require(not twice, "run.seeds", f"lists seed(s) {twice} more than once")
        repeated = sorted({m for m in run.compare if run.compare.count(m) > 1})
        require(not repeated, "run.compare", f"lists method(s) {repeated} more than once")


def _section_type(name: str, value: Any, hints: Mapping[str, Any]) -> Any:
    """The dataclass of section ``name``; ``engine`` is chosen by its ``name`` key."""
    if name != "engine":
        return hints[name]
    engine = value.get("name", "hf") if isinstance(value, Mapping) else "hf"
    one_of(engine, tuple(ENGINE_CONFIGS), "engine.name")
    return ENGINE_CONFIGS[engine]


def _readable_shape(path: str) -> ModelShape | None:
    """The model's shape from ``path/config.json``; ``None`` when it is not there (yet): the
    trainer then fails on the missing model, preflight on the path."""
    try:
        return ModelShape.from_model_dir(path)
    except (OSError, ValueError):
        return None
