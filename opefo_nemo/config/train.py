"""The trainer's configuration (``conf/config.yaml`` and its groups) as validated dataclasses, one
section per module (docs/training.md, "Configuration").
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opefo_nemo.config.data import DataConfig
from opefo_nemo.config.engines import (
    CONTIGUOUS,
    ENGINE_CONFIGS,
    EngineConfig,
    MegatronEngineConfig,
)
from opefo_nemo.config.metrics import MetricsConfig, ValidationConfig
from opefo_nemo.config.model import ModelConfig
from opefo_nemo.config.reward import AdvantageConfig, RewardConfig
from opefo_nemo.config.rollout import RolloutConfig
from opefo_nemo.config.run import CheckpointConfig, RunConfig, TrainerConfig
from opefo_nemo.core.objectives import MethodConfig, method_config
from opefo_nemo.core.schema import build, one_of, require
from opefo_nemo.models.shape import ModelShape


@dataclass(frozen=True)
class TrainConfig:
    """Every section of ``conf/config.yaml``; ``method`` is the settings dataclass of the chosen
    method (a :class:`MethodConfig` subclass, core.objectives). :meth:`from_mapping` is the only
    way in: an unknown key, a wrong type, an impossible value or a contradiction between sections
    fails at start-up naming the key. Each section's dataclass holds its keys' defaults and
    meanings and checks its own keys; :meth:`validate` adds the checks that span sections."""

    method: MethodConfig
    """The objective of spec §5 and its settings (``conf/method/``)."""
    run: RunConfig = field(default_factory=RunConfig)
    """What is trained, and where it goes."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model (``conf/model/``)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The training and validation problems (``conf/data/``)."""
    engine: EngineConfig | MegatronEngineConfig = field(default_factory=EngineConfig)
    """The training engine and its optimizer (``conf/engine/``)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The generation service and its sampling (``conf/rollout/``)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """How many steps, and what each samples."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """Group-relative advantages (spec §4)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """How responses are scored (docs/rewards_data_eval.md)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When checkpoints are written, and where a run starts."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """Held-out evaluation (spec §7)."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Measurements beside the step metrics of spec §6, and where they are logged."""

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
        """Each section's own checks, then the contradictions between sections (spec §4, §5)."""
        for name in typing.get_type_hints(type(self)):
            if name != "method":  # validated by method_config, with its own prefix
                getattr(self, name).validate()
        require(
            self.rollout_batch_size % self.method.updates_per_rollout == 0,
            "method.updates_per_rollout",
            f"({self.method.updates_per_rollout}) must divide the rollout batch "
            f"trainer.prompts_per_step × trainer.responses_per_prompt = {self.rollout_batch_size}",
        )
        require(
            not (isinstance(self.engine, EngineConfig) and self.engine.shared_forward)
            or self.method.updates_per_rollout == 1,
            "engine.shared_forward",
            f"is for strict on-policy steps; method.updates_per_rollout="
            f"{self.method.updates_per_rollout} takes a fresh statistics pass per mini-batch",
        )
        if isinstance(self.engine, MegatronEngineConfig):
            shape = _readable_shape(self.model.path)
            if shape is not None:
                self.engine.validate_model(shape, f"model.path={self.model.path}")
        require(
            self.rollout.name != "engine" or self.engine.name == "hf",
            "rollout.name",
            f"is engine (the training engine samples with its own model), which only engine=hf "
            f"supports, not engine={self.engine.name}: use rollout=vllm",
        )
        self._validate_layout()
        max_new_tokens, buffer = self.rollout.max_new_tokens, self.reward.overlong_buffer
        require(
            buffer < max_new_tokens,
            "reward.overlong_buffer",
            f"({buffer}) must be below rollout.max_new_tokens ({max_new_tokens})",
        )

    def _validate_layout(self) -> None:
        """The token budget holds the longest row the run can make (every row then fits a
        micro-batch), and a method that takes a statistic per micro-batch keeps the contiguous
        micro-batches (spec §11)."""
        engine, budget = self.engine, self.engine.max_tokens_per_micro_batch
        longest = self.data.max_prompt_tokens + self.rollout.max_new_tokens
        multiple = engine.sequence_multiple
        padded = -(-longest // multiple) * multiple
        require(
            budget is None or budget >= padded,
            "engine.max_tokens_per_micro_batch",
            f"({budget}) must hold the longest response with its prompt: "
            f"data.max_prompt_tokens + rollout.max_new_tokens = {longest}"
            + (
                f", rounded up to the sequence-parallel multiple {multiple}: {padded}"
                if padded != longest
                else ""
            ),
        )
        require(
            self.method.layout_invariant or (engine.batch_layout == CONTIGUOUS and budget is None),
            "engine.batch_layout",
            f"is {engine.batch_layout}"
            + ("" if budget is None else f" with engine.max_tokens_per_micro_batch={budget}")
            + f", but method {self.method.name!r} takes a statistic over each micro-batch of "
            "engine.micro_batch_size responses: set engine.batch_layout=contiguous and "
            "engine.max_tokens_per_micro_batch=null",
        )


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
