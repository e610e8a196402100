"""Typed, validated settings of a policy-optimisation method (one ``conf/method/*.yaml``).

``MethodConfig.from_mapping`` is the only way from untyped data (YAML, CLI overrides) to a method:
it rejects unknown keys and impossible values with a message naming the key's full path, and
contradictions between the method and its settings (spec §3, §5).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..entropy_flow import BALANCES, ESTIMATORS


@dataclass(frozen=True)
class EntropyFlowConfig:
    """spec §2–§3: which ΔH estimator and which balancing variant."""

    estimator: str = "paper"
    balance: str = "none"
    static_lambda: float = 0.001


@dataclass(frozen=True)
class ClipCovConfig:
    """spec §5 Clip-Cov: remove the gradient of a random ``ratio`` of tokens with lb < cov < ub."""

    ratio: float = 2e-4
    lb: float = 1.0
    ub: float = 5.0


@dataclass(frozen=True)
class KLCovConfig:
    """spec §5 KL-Cov: penalise ``coef·|logprob − logprob_old|`` on the top ``ratio`` by cov."""

    ratio: float = 2e-3
    coef: float = 1.0


@dataclass(frozen=True)
class MethodConfig:
    """One method of spec §5 with its settings; ``name`` is a key of the objective registry."""

    name: str
    updates_per_rollout: int = 1
    lr: float = 2.83e-6
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    entropy_coef: float = 0.0
    entropy_flow: EntropyFlowConfig = field(default_factory=EntropyFlowConfig)
    clip_cov: ClipCovConfig = field(default_factory=ClipCovConfig)
    kl_cov: KLCovConfig = field(default_factory=KLCovConfig)

    @property
    def strict_on_policy(self) -> bool:
        """One optimizer step per rollout batch, so ``ρ ≡ 1`` (spec §5)."""
        return self.updates_per_rollout == 1

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], prefix: str = "method") -> MethodConfig:
        """Build and validate a config from a plain mapping; errors name ``prefix.key``."""
        config = _build(cls, data, prefix)
        config.validate(prefix)
        return config

    def validate(self, prefix: str = "method") -> None:
        """Check ranges and the method's contract; raise ``ValueError`` naming the key."""
        from .registry import get_objective

        objective = get_objective(self.name)
        _require(self.updates_per_rollout >= 1, f"{prefix}.updates_per_rollout", "must be >= 1")
        _positive(self.lr, f"{prefix}.lr")
        _positive(self.clip_eps_low, f"{prefix}.clip_eps_low")
        _positive(self.clip_eps_high, f"{prefix}.clip_eps_high")
        _require(self.clip_eps_low < 1, f"{prefix}.clip_eps_low", "must be < 1")
        _require(
            math.isfinite(self.entropy_coef) and self.entropy_coef >= 0,
            f"{prefix}.entropy_coef",
            "must be a finite number >= 0",
        )
        flow = self.entropy_flow
        _require(
            flow.estimator in ESTIMATORS,
            f"{prefix}.entropy_flow.estimator",
            f"is {flow.estimator!r}; expected one of {ESTIMATORS}",
        )
        _require(
            flow.balance in BALANCES,
            f"{prefix}.entropy_flow.balance",
            f"is {flow.balance!r}; expected one of {BALANCES}",
        )
        _require(
            math.isfinite(flow.static_lambda) and -1 < flow.static_lambda < 1,
            f"{prefix}.entropy_flow.static_lambda",
            "must lie in (-1, 1)",
        )
        _fraction(self.clip_cov.ratio, f"{prefix}.clip_cov.ratio")
        _require(self.clip_cov.lb < self.clip_cov.ub, f"{prefix}.clip_cov.lb", "must be < ub")
        _fraction(self.kl_cov.ratio, f"{prefix}.kl_cov.ratio")
        _require(
            math.isfinite(self.kl_cov.coef) and self.kl_cov.coef >= 0,
            f"{prefix}.kl_cov.coef",
            "must be a finite number >= 0",
        )
        _require(
            flow.balance == objective.balance,
            f"{prefix}.entropy_flow.balance",
            f"is {flow.balance!r}, but method {self.name!r} balances {objective.balance!r}",
        )
        _require(
            not (objective.strict and self.updates_per_rollout != 1),
            f"{prefix}.updates_per_rollout",
            f"is {self.updates_per_rollout}, but {self.name!r} is strict on-policy (exactly 1)",
        )
        _require(
            not (objective.entropy_grad and self.entropy_coef == 0),
            f"{prefix}.entropy_coef",
            f"is 0, so {self.name!r} would be plain grpo",
        )
        if objective.selection == "kl_cov" and self.strict_on_policy:
            warnings.warn(
                f"{prefix}: KL-Cov's penalty |logprob - logprob_old| is identically zero with one "
                "update per rollout (strict on-policy, ratio = 1); only its top-k selection runs",
                stacklevel=2,
            )


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown key {prefix}.{unknown[0]} (known keys of {prefix}: {', '.join(fields)})"
        )
    values: dict[str, Any] = {}
    for name, value in data.items():
        path = f"{prefix}.{name}"
        kind = fields[name].type
        nested = {
            "EntropyFlowConfig": EntropyFlowConfig,
            "ClipCovConfig": ClipCovConfig,
            "KLCovConfig": KLCovConfig,
        }.get(str(kind))
        if nested is not None:
            values[name] = _build(nested, value or {}, path)
        else:
            values[name] = _coerce(value, str(kind), path)
    if "name" in fields and "name" not in values:
        raise ValueError(f"missing key {prefix}.name")
    return cls(**values)


def _coerce(value: Any, kind: str, path: str) -> Any:
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{path} must be a string, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path} must be an integer, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path} must be a number, got {value!r}")
    return float(value)


def _require(ok: bool, path: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{path} {message}")


def _positive(value: float, path: str) -> None:
    _require(math.isfinite(value) and value > 0, path, f"must be > 0, got {value}")


def _fraction(value: float, path: str) -> None:
    _require(0 < value <= 1, path, f"must lie in (0, 1], got {value}")
