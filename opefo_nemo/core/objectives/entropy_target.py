"""The entropy target of a closed-loop method (spec §3, §5), and the base that ``opefo``'s
``balance: target`` and ``entropy_neutral`` share: its settings, its resolution, its metric and
its checkpointed state."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

from opefo_nemo.core.objectives.base import (
    BatchStatistics,
    EntropyFlowConfig,
    MethodConfig,
    Objective,
)
from opefo_nemo.core.schema import one_of, require

INITIAL = "initial"
BALANCE = "balance"
"""Field metadata: the ``entropy_flow.balance`` a setting applies under. A method's file in
``conf/method/`` lists the setting only when the method accepts that balance."""


def require_target(target: object, path: str, *, optional: bool = False) -> None:
    """Fail naming ``path`` unless ``target`` is a number >= 0 or ``initial`` (or optional null)."""
    require(
        (optional and target is None)
        or target == INITIAL
        or (isinstance(target, float) and math.isfinite(target) and target >= 0),
        path,
        f"must be {'null, ' if optional else ''}a number >= 0 (nats) or {INITIAL!r}, "
        f"got {target!r}",
    )


class EntropyTarget:
    """``H_target``: the configured number, or ``initial`` resolved by the first batch seen."""

    def __init__(self, configured: float | str):
        self.from_first_step = configured == INITIAL
        self.value: float | None = None if self.from_first_step else float(configured)

    def resolve(self, mean_entropy: float) -> float:
        """``H_target``; an unresolved ``initial`` becomes this batch's ``H̄``."""
        if self.value is None:
            self.value = mean_entropy
        return self.value

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep: the resolved ``initial`` (a number needs nothing)."""
        return {"target_entropy": self.value} if self.from_first_step else {}

    def restore(self, state: Mapping[str, Any]) -> None:
        if "target_entropy" in state:
            value = state["target_entropy"]
            self.value = None if value is None else float(value)


@dataclass(frozen=True)
class TargetFlowConfig(EntropyFlowConfig):
    """``entropy_flow`` of a method that can steer the entropy to a target; a method adds how
    strongly it steers (``opefo``: ``target_gain``; ``entropy_neutral``: ``target_rate``)."""

    balance: str = "adaptive"
    """The method's variant (each method accepts its own):"""
    target_entropy: float | str = field(default=INITIAL, metadata={BALANCE: "target"})
    """balance=target only: nats, or ``initial`` (the first step's token-mean entropy H̄, kept in
    the checkpoint)."""

    def validate(self, path: str) -> None:
        super().validate(path)
        require_target(self.target_entropy, f"{path}.target_entropy")


FlowT = TypeVar("FlowT", bound=TargetFlowConfig)


class TargetedObjective(Objective, Generic[FlowT]):
    """An objective whose ``entropy_flow`` (a ``FlowT``) may ask for ``balance: target``.

    ``balances``: the values its ``balance`` accepts (checked at start-up). It resolves
    ``H_target`` (:meth:`target_entropy`), logs it as ``flow/target_entropy`` and keeps a resolved
    ``initial`` in the checkpoint (``{"target_entropy": H}``).
    """

    balances: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: MethodConfig):
        super().__init__(config)
        if not isinstance(config.entropy_flow, TargetFlowConfig):
            raise TypeError(f"method {config.name!r} needs a TargetFlowConfig as entropy_flow")
        self.target = EntropyTarget(self.flow.target_entropy)

    @property
    def flow(self) -> FlowT:
        """The method's ``entropy_flow`` (its type checked by ``config_type`` at construction)."""
        return cast(FlowT, self.config.entropy_flow)

    @property
    def targeted(self) -> bool:
        return self.flow.balance == "target"

    @classmethod
    def check(cls, config: MethodConfig, prefix: str) -> None:
        super().check(config, prefix)
        assert isinstance(config.entropy_flow, TargetFlowConfig)  # config_type's field
        one_of(config.entropy_flow.balance, cls.balances, f"{prefix}.entropy_flow.balance")

    def target_entropy(self, batch: BatchStatistics) -> float | None:
        """``H_target`` under ``balance: target`` (an unresolved ``initial`` becomes this batch's
        ``H̄``), ``None`` under any other balance."""
        return self.target.resolve(batch.mean_entropy) if self.targeted else None

    def metrics(self, batch: BatchStatistics) -> dict[str, float]:
        metrics = super().metrics(batch)
        if self.targeted and self.target.value is not None:
            metrics["flow/target_entropy"] = self.target.value
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return self.target.state_dict() if self.targeted else {}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.target.restore(state)
