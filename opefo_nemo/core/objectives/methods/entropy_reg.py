"""Entropy-Reg (spec §5): the clipped surrogate minus ``β H_t``, the entropy differentiated; β
fixed (``entropy_coef``, the paper: 0.01) or, with ``entropy_coef_target``, set by a closed loop
on each optimizer step's token-mean entropy (docs/core.md, "Entropy-Reg's closed loop").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from opefo_nemo.core.objectives.base import BatchStatistics, non_negative
from opefo_nemo.core.objectives.entropy_target import INITIAL, require_target
from opefo_nemo.core.objectives.methods.clipped_surrogate import ClippedConfig, ClippedSurrogate
from opefo_nemo.core.objectives.registry import register_objective
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs
from opefo_nemo.core.reduction import BatchReducer
from opefo_nemo.core.schema import one_of, require

RULES = ("skywork", "current")


@dataclass(frozen=True)
class EntropyRegConfig(ClippedConfig):
    entropy_coef: float = 0.01
    """β (paper: fixed 0.01); with a target, the controller's starting value."""
    entropy_coef_target: float | str | None = None
    """null: β fixed. Nats or ``initial`` (the first step's token-mean entropy, kept in the
    checkpoint): β closed-loop, raised by ``entropy_coef_step`` while the batch entropy is below
    the target, lowered above it."""
    entropy_coef_step: float = 1e-3
    """With a target: the change of β per optimizer step, >= 0."""
    entropy_coef_min: float = 0.0
    """With a target: β's lower bound, >= 0."""
    entropy_coef_max: float = 0.1
    """With a target: β's upper bound (``entropy_coef`` must lie within the bounds)."""
    entropy_coef_rule: str = "skywork"
    """With a target: ``skywork`` (Skywork-OR1's control, as TRL's ``use_adaptive_entropy``: c
    stepped after each step by H <= target, and applied in the next step only if that H was <=
    target; none on the first) | ``current`` (c stepped by sign(target − H) on the step's own
    batch, applied to its loss); docs/core.md, "Entropy-Reg's closed loop"."""

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
        one_of(self.entropy_coef_rule, RULES, f"{prefix}.entropy_coef_rule")
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
    """Entropy-Reg (paper Table 1): GRPO minus β H_t, the entropy differentiated: ``ℓ_t =
    clipped surrogate − β H_t``, β fixed or closed-loop (docs/core.md, "Entropy-Reg's closed
    loop")."""

    config_type = EntropyRegConfig
    differentiates_entropy = True

    def __init__(self, config: EntropyRegConfig):
        super().__init__(config)
        self.coef = config.entropy_coef  # the controller c (β itself when fixed)
        self.applied = config.entropy_coef  # the β of the current step's loss
        target = config.entropy_coef_target
        self.target: float | None = None if target in (None, INITIAL) else float(target)
        self.last_entropy: float | None = None  # skywork: the previous step's H (its gate)

    @property
    def settings(self) -> EntropyRegConfig:
        assert isinstance(self.config, EntropyRegConfig)
        return self.config

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        if self.settings.entropy_coef_target is not None:
            self._close_loop(batch.mean_entropy)
        return super().coefficients(batch, reducer, seed)

    def _close_loop(self, entropy: float) -> None:
        """Step the controller ``c`` on this step's ``H`` and set the β of its loss. The target is
        in nats, or ``initial``: the first optimizer step's token-mean entropy; ``c`` starts at
        ``entropy_coef``, moves by ``s = entropy_coef_step`` and stays in
        ``[entropy_coef_min, entropy_coef_max]``.

        * ``skywork`` (Skywork-OR1's adaptive entropy control, as TRL's
          ``use_adaptive_entropy``): the loss uses ``β = c`` if the previous step's ``H`` was
          ``<= H_target``, else 0 (and 0 on the first step); after it, ``c ← clip(c + s)`` if this
          step's ``H <= H_target``, else ``clip(c − s)``, and this ``H`` gates the next step;
        * ``current``: before the loss, ``c ← clip(c + s · sign(H_target − H))`` and ``β = c``.
        """
        s = self.settings
        if self.target is None:
            self.target = entropy
        if s.entropy_coef_rule == "skywork":
            gate_open = self.last_entropy is not None and self.last_entropy <= self.target
            self.applied = self.coef if gate_open else 0.0
            direction = 1 if entropy <= self.target else -1
            self.last_entropy = entropy
        else:
            error = self.target - entropy
            direction = (error > 0) - (error < 0)
        stepped = self.coef + s.entropy_coef_step * direction
        self.coef = min(max(stepped, s.entropy_coef_min), s.entropy_coef_max)
        if s.entropy_coef_rule == "current":
            self.applied = self.coef

    def metrics(self, batch: BatchStatistics) -> dict[str, float]:
        """``entropy_reg/coef`` (the β of the step's loss) and, with a target,
        ``entropy_reg/controller`` (``c`` after the step's update)."""
        if self.settings.entropy_coef_target is None:
            return {"entropy_reg/coef": self.applied}
        return {"entropy_reg/coef": self.applied, "entropy_reg/controller": self.coef}

    def token_loss(self, inputs: LossInputs) -> Tensor:
        assert inputs.entropy is not None  # policy_loss checks differentiates_entropy
        return super().token_loss(inputs) - self.applied * inputs.entropy

    def state_dict(self) -> dict[str, Any]:
        s = self.settings
        if s.entropy_coef_target is None:
            return {}
        if s.entropy_coef_rule == "current":
            return {"coef": self.coef, "target": self.target}
        return {"coef": self.coef, "target": self.target, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Also takes a ``current``-rule checkpoint (``coef``, ``target``) under ``skywork``: no
        previous entropy is carried, so the next step's gate is shut, as on a first step."""
        if self.settings.entropy_coef_rule == "skywork" and set(state) == {"coef", "target"}:
            state = {**state, "last_entropy": None}
        super().load_state_dict(state)

    def restore(self, state: Mapping[str, Any]) -> None:
        if state:
            self.coef = float(state["coef"])
            self.target = None if state["target"] is None else float(state["target"])
            last = state.get("last_entropy")
            self.last_entropy = None if last is None else float(last)
