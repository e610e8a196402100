"""Entropy-Reg (spec §5): the clipped surrogate minus ``β H_t``, the entropy differentiated.

With ``entropy_coef_target`` null, β is the fixed ``entropy_coef`` (the paper: 0.01). With a target
(nats, or ``initial``: the first optimizer step's token-mean entropy, kept in the checkpoint), β
is closed-loop: before each optimizer step's loss, ``β ← clip(β + s · sign(H_target − H_batch),
β_min, β_max)`` with ``s = entropy_coef_step``, so β rises while the batch entropy is below the
target and falls above it; it starts at ``entropy_coef``. Logged as ``entropy_reg/coef``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ...reduction import BatchReducer
from ...schema import require
from ..base import BatchStatistics, non_negative
from ..entropy_target import INITIAL, require_target
from ..registry import register_objective
from ..tokens import Coefficients, LossInputs
from .clipped import ClippedConfig, ClippedSurrogate


@dataclass(frozen=True)
class EntropyRegConfig(ClippedConfig):
    entropy_coef: float = 0.01
    entropy_coef_target: float | str | None = None
    entropy_coef_step: float = 1e-3
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 0.1

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        non_negative(self.entropy_coef, f"{prefix}.entropy_coef")
        target = self.entropy_coef_target
        require_target(target, f"{prefix}.entropy_coef_target", optional=True)
        if target is None:
            require(
                self.entropy_coef > 0,
                f"{prefix}.entropy_coef",
                f"is 0 with no entropy_coef_target, so {self.name!r} would be plain grpo",
            )
            return
        non_negative(self.entropy_coef_step, f"{prefix}.entropy_coef_step")
        non_negative(self.entropy_coef_min, f"{prefix}.entropy_coef_min")
        require(
            self.entropy_coef_min <= self.entropy_coef <= self.entropy_coef_max,
            f"{prefix}.entropy_coef",
            f"({self.entropy_coef}) must lie in [entropy_coef_min, entropy_coef_max] = "
            f"[{self.entropy_coef_min}, {self.entropy_coef_max}]",
        )


@register_objective("entropy_reg")
class EntropyReg(ClippedSurrogate):
    """``ℓ_t = clipped surrogate − β H_t`` (module docstring)."""

    config_type = EntropyRegConfig
    differentiates_entropy = True

    def __init__(self, config: EntropyRegConfig):
        super().__init__(config)
        self.coef = config.entropy_coef
        target = config.entropy_coef_target
        self.target: float | None = None if target in (None, INITIAL) else float(target)

    @property
    def settings(self) -> EntropyRegConfig:
        assert isinstance(self.config, EntropyRegConfig)
        return self.config

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        s = self.settings
        if s.entropy_coef_target is not None:
            if self.target is None:
                self.target = batch.mean_entropy
            error = self.target - batch.mean_entropy
            direction = (error > 0) - (error < 0)
            stepped = self.coef + s.entropy_coef_step * direction
            self.coef = min(max(stepped, s.entropy_coef_min), s.entropy_coef_max)
        return super().coefficients(batch, reducer, seed)

    def metrics(self, batch: BatchStatistics) -> dict[str, float]:
        return {"entropy_reg/coef": self.coef}

    def token_loss(self, inputs: LossInputs) -> Tensor:
        assert inputs.entropy is not None  # policy_loss checks differentiates_entropy
        return super().token_loss(inputs) - self.coef * inputs.entropy

    def state_dict(self) -> dict[str, Any]:
        if self.settings.entropy_coef_target is None:
            return {}
        return {"coef": self.coef, "target": self.target}

    def restore(self, state: Mapping[str, Any]) -> None:
        if state:
            self.coef = float(state["coef"])
            self.target = None if state["target"] is None else float(state["target"])
