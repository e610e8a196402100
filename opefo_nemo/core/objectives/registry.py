"""The objective registry: method name → :class:`~.base.Objective` subclass, and the way from
untyped settings (YAML, overrides) to a validated method. Adding a method (one module + one YAML):
docs/core.md, "Adding a method".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opefo_nemo.core.objectives.base import MethodConfig, Objective
from opefo_nemo.core.schema import build

ObjectiveClass = TypeVar("ObjectiveClass", bound=type[Objective])
_REGISTRY: dict[str, type[Objective]] = {}


def register_objective(name: str) -> Callable[[ObjectiveClass], ObjectiveClass]:
    """Class decorator registering an :class:`Objective` subclass under ``name``. A module outside
    ``opefo_nemo.core.objectives.methods`` must be imported before the config is read (e.g. by
    the script that starts training)."""

    def decorate(cls: ObjectiveClass) -> ObjectiveClass:
        if name in _REGISTRY:
            raise ValueError(f"objective {name!r} is registered twice")
        if not issubclass(cls, Objective):
            raise TypeError(f"objective {name!r} must subclass Objective")
        _REGISTRY[name] = cls
        return cls

    return decorate


def objective_class(name: str) -> type[Objective]:
    """The objective registered as ``name``; the error lists the known names."""
    from opefo_nemo.core.objectives import methods  # noqa: F401  (registers the built-in methods)

    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown method name {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        ) from None


def registered_objectives() -> list[str]:
    """Names of every registered objective, sorted."""
    from opefo_nemo.core.objectives import methods  # noqa: F401

    return sorted(_REGISTRY)


def method_config(data: Mapping[str, Any], prefix: str = "method") -> MethodConfig:
    """A validated method config from a plain mapping (``name`` picks the settings dataclass).

    Unknown keys, wrong types, impossible values and contradictions with the method's contract
    raise ``ValueError`` naming ``prefix.key``.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix} must be a mapping, got {type(data).__name__}")
    if "name" not in data:
        raise ValueError(f"missing key {prefix}.name")
    name = data["name"]
    if not isinstance(name, str):
        raise ValueError(f"{prefix}.name must be a string, got {name!r}")
    cls = objective_class(name)
    config = build(cls.config_type, data, prefix)
    cls.check(config, prefix)
    return config


def build_objective(config: MethodConfig) -> Objective:
    """The objective of ``config`` (one per run: it may carry state from step to step)."""
    return objective_class(config.name)(config)
