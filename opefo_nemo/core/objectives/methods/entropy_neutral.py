"""``entropy_neutral``: strict GRPO whose applied update is corrected along ``∇θ H̄`` (spec §3,
"Exact first order"; :mod:`opefo_nemo.core.update_correction`).

The loss is strict GRPO's, ``−A_t log π(y_t)`` (w ≡ 1, optionally times the truncated
importance-sampling weight). The engine then measures the update ``Δθ`` the optimizer applied and
adds ``α ∇θ H̄`` so that the exact first-order change of the batch's token-mean entropy ``H̄``
is ``c``: ``balance: adaptive`` wants ``c = 0``; ``balance: target`` wants
``c = g (H_target − H̄)``, closing the share ``g = target_gain`` of the gap per step, with
``H_target = target_entropy`` a number or ``initial`` (the first step's ``H̄``, kept in the
checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...schema import one_of, require
from ..base import BatchStatistics, EntropyFlowConfig, MethodConfig
from ..entropy_target import INITIAL, EntropyTarget, require_target
from ..registry import register_objective
from .policy_gradient import StrictConfig, StrictPolicyGradient

BALANCES = ("adaptive", "target")


@dataclass(frozen=True)
class NeutralFlowConfig(EntropyFlowConfig):
    """The wanted first-order entropy change of each step (module docstring)."""

    balance: str = "adaptive"
    target_entropy: float | str = INITIAL
    target_gain: float = 0.1


@dataclass(frozen=True)
class EntropyNeutralConfig(StrictConfig):
    entropy_flow: NeutralFlowConfig = field(default_factory=NeutralFlowConfig)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        flow, path = self.entropy_flow, f"{prefix}.entropy_flow"
        one_of(flow.balance, BALANCES, f"{path}.balance")
        require_target(flow.target_entropy, f"{path}.target_entropy")
        require(
            math.isfinite(flow.target_gain) and 0 < flow.target_gain <= 1,
            f"{path}.target_gain",
            f"must lie in (0, 1] (the share of the entropy gap closed per step), got "
            f"{flow.target_gain}",
        )


@register_objective("entropy_neutral")
class EntropyNeutral(StrictPolicyGradient):
    """Strict GRPO's loss; the engine corrects the update to :meth:`update_target`."""

    config_type: ClassVar[type[MethodConfig]] = EntropyNeutralConfig
    corrects_update = True

    def __init__(self, config: MethodConfig):
        super().__init__(config)
        self.target = EntropyTarget(self.flow.target_entropy)

    @property
    def flow(self) -> NeutralFlowConfig:
        assert isinstance(self.config, EntropyNeutralConfig)
        return self.config.entropy_flow

    def update_target(self, batch: BatchStatistics) -> float:
        """``0`` (adaptive) or ``g (H_target − H̄)`` (target), in nats per step."""
        if self.flow.balance == "adaptive":
            return 0.0
        target = self.target.resolve(batch.mean_entropy)
        return self.flow.target_gain * (target - batch.mean_entropy)

    def metrics(self, batch: BatchStatistics) -> dict[str, float]:
        if self.flow.balance == "target" and self.target.value is not None:
            return {"flow/target_entropy": self.target.value}
        return {}

    def state_dict(self) -> dict[str, Any]:
        return self.target.state_dict() if self.flow.balance == "target" else {}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.target.restore(state)
