"""The objective registry: a method of spec §5 is one per-token loss function plus its contract.

Adding a method is one decorated function, or one more decorator on an existing loss (in
``losses.py`` or a module of your own, imported before use), and one ``conf/method/<name>.yaml``::

    @register_objective("my_method", strict=True, balance="adaptive")
    def my_method(inputs: LossInputs, config: MethodConfig) -> Tensor:
        return -inputs.weight * inputs.advantages * inputs.logprob
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..entropy_flow import BALANCES

if TYPE_CHECKING:
    from torch import Tensor

    from .config import MethodConfig
    from .tokens import LossInputs

TokenLoss = Callable[["LossInputs", "MethodConfig"], "Tensor"]
SELECTIONS = ("clip_cov", "kl_cov")


@dataclass(frozen=True)
class Objective:
    """A registered method.

    ``strict``: needs ``ρ ≡ 1`` (exactly one update per rollout). ``balance``: the entropy-flow
    variant of spec §3 it applies. ``selection``: the batch-level token selection it needs
    (``clip_cov`` or ``kl_cov``), chosen globally in ``prepare``. ``entropy_grad``: its loss
    differentiates the entropy, so the update pass must produce entropy with gradient.
    ``ratio_clip``: its loss clips the ratio ρ (the clipped surrogate), so the ``clip/*`` metrics
    of spec §6 count its clipped tokens; without it nothing is clipped and they are 0.
    """

    name: str
    token_loss: TokenLoss
    strict: bool
    balance: str = "none"
    selection: str | None = None
    entropy_grad: bool = False
    ratio_clip: bool = False


_REGISTRY: dict[str, Objective] = {}


def register_objective(
    name: str,
    *,
    strict: bool,
    balance: str = "none",
    selection: str | None = None,
    entropy_grad: bool = False,
    ratio_clip: bool = False,
) -> Callable[[TokenLoss], TokenLoss]:
    """Decorator registering ``fn(inputs, config) -> per-token loss ℓ_t`` under ``name``."""
    if balance not in BALANCES:
        raise ValueError(f"objective {name!r}: unknown balance {balance!r}")
    if selection is not None and selection not in SELECTIONS:
        raise ValueError(f"objective {name!r}: unknown selection {selection!r}")

    def decorate(fn: TokenLoss) -> TokenLoss:
        if name in _REGISTRY:
            raise ValueError(f"objective {name!r} is registered twice")
        _REGISTRY[name] = Objective(name, fn, strict, balance, selection, entropy_grad, ratio_clip)
        return fn

    return decorate


def get_objective(name: str) -> Objective:
    """The registered objective ``name``; the error lists the known names."""
    from . import losses  # noqa: F401  (registers the built-in methods)

    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown method name {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        ) from None


def registered_objectives() -> list[str]:
    """Names of every registered objective, sorted."""
    from . import losses  # noqa: F401

    return sorted(_REGISTRY)
