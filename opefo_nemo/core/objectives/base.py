"""What a method of spec §5 is: a settings dataclass and an :class:`Objective` (the plug-in).

A method is one module and one ``conf/method/<name>.yaml`` (docs/core.md walks through one):

* its **settings**: a frozen dataclass deriving from :class:`MethodConfig`, validated by the one
  config validator (:func:`opefo_nemo.core.schema.build`) and its own ``validate``;
* its **objective**: a subclass of :class:`Objective` registered under the method's name, with
  - ``local_sums(chunk, delta_h)``: its share of extra batch sums over one chunk (phase 2);
  - ``coefficients(batch, reducer, seed)``: per-token coefficients from the *global* sums;
  - ``token_loss(inputs)``: the per-token loss ``ℓ_t`` (phase 3);
  - ``loss_sums`` / ``loss_metrics``: its metric numerators per micro-batch and their ratios;
  - ``metrics(batch)``: its step metrics; ``state_dict`` / ``restore``: what it carries from
    step to step (kept in the checkpoint; ``load_state_dict`` checks the keys, then restores);
  - ``update_target(batch)``: for a method that corrects the applied update along ``∇θ H̄``
    (``corrects_update``), the first-order entropy change it wants from the step.

Every method gets, without writing anything: ΔH with the configured estimator, the flow sums P
and N, λ*, the token-mean entropy and their metrics (spec §2, §3, §6), the global token count and
the loss as a global token mean (spec §5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from ..entropy_flow import ESTIMATORS
from ..reduction import BatchReducer
from ..schema import one_of, require
from .tokens import Coefficients, LossInputs, TokenChunk


@dataclass(frozen=True)
class EntropyFlowConfig:
    """spec §2: the ΔH estimator (every method logs the flows and λ*)."""

    estimator: str = "paper"


@dataclass(frozen=True)
class MethodConfig:
    """The settings every method has; a method's own dataclass derives from this one."""

    name: str
    updates_per_rollout: int = 1
    lr: float = 2.83e-6
    entropy_flow: EntropyFlowConfig = field(default_factory=EntropyFlowConfig)

    @property
    def strict_on_policy(self) -> bool:
        """One optimizer step per rollout batch, so ``ρ ≡ 1`` (spec §5)."""
        return self.updates_per_rollout == 1

    def validate(self, prefix: str) -> None:
        """Ranges of the common keys; a subclass extends it (``super().validate(prefix)``)."""
        require(self.updates_per_rollout >= 1, f"{prefix}.updates_per_rollout", "must be >= 1")
        positive(self.lr, f"{prefix}.lr")
        one_of(self.entropy_flow.estimator, ESTIMATORS, f"{prefix}.entropy_flow.estimator")


@dataclass(frozen=True)
class BatchStatistics:
    """What phase 2 knows of the optimizer-step batch when an objective derives coefficients.

    ``chunks``: this rank's chunks; ``delta_h``: ΔH of each (same shapes, fp32). ``sums``: the
    *global* sums (0-d float64): the common ones (``prepare.COMMON_SUMS``: ``tokens``,
    ``entropy``, ``flow_pos``, ``flow_neg``, ``count_pos``, ``count_neg`` and the split sums of
    ``core.reweighting``) and the objective's own. ``lambda_star``: λ* of the global P and N
    (spec §3).
    """

    chunks: Sequence[TokenChunk]
    delta_h: Sequence[Tensor]
    sums: Mapping[str, Tensor]
    n_tokens: int
    lambda_star: float

    @property
    def mean_entropy(self) -> float:
        """Token mean of ``H_t`` over the batch's valid tokens."""
        return float(self.sums["entropy"]) / self.n_tokens


class Objective:
    """A method of spec §5 (see the module docstring); one instance lives for a whole run.

    Class attributes: ``config_type`` (its settings dataclass); ``strict`` (needs ``ρ ≡ 1``:
    exactly one update per rollout); ``differentiates_entropy`` (its loss reads ``H_t`` with
    gradient); ``loss_sum_names`` (the keys of :meth:`loss_sums`, besides ``loss``);
    ``corrects_update`` (the engine corrects the applied update to :meth:`update_target`).
    """

    name: ClassVar[str] = ""
    config_type: ClassVar[type[MethodConfig]] = MethodConfig
    strict: ClassVar[bool] = True
    differentiates_entropy: ClassVar[bool] = False
    loss_sum_names: ClassVar[tuple[str, ...]] = ()
    corrects_update: ClassVar[bool] = False

    def __init__(self, config: MethodConfig):
        if not isinstance(config, self.config_type):
            raise TypeError(
                f"method {config.name!r} needs a {self.config_type.__name__}, "
                f"got {type(config).__name__}"
            )
        self.config = config

    @classmethod
    def check(cls, config: MethodConfig, prefix: str) -> None:
        """The settings' own ranges, then the method's contract; errors name the key."""
        config.validate(prefix)
        require(
            not (cls.strict and config.updates_per_rollout != 1),
            f"{prefix}.updates_per_rollout",
            f"is {config.updates_per_rollout}, but {config.name!r} is strict on-policy (exactly 1)",
        )

    # ------------------------------------------------------------------ phase 2
    def local_sums(self, chunk: TokenChunk, delta_h: Tensor) -> dict[str, Tensor]:
        """This chunk's share of the objective's own global sums (0-d float64 each)."""
        return {}

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        """Per-token coefficients of every chunk (default: weight 1, nothing selected)."""
        return [
            Coefficients(delta_h=dh, weight=torch.ones_like(dh), selected=torch.zeros_like(c.mask))
            for c, dh in zip(batch.chunks, batch.delta_h, strict=True)
        ]

    def metrics(self, batch: BatchStatistics) -> dict[str, float]:
        """The objective's own step metrics (called after :meth:`coefficients`)."""
        return {}

    def update_target(self, batch: BatchStatistics) -> float | None:
        """The first-order change ``⟨∇θ H̄, Δθ'⟩`` the corrected update must have
        (:mod:`opefo_nemo.core.update_correction`), or ``None``: the update is not corrected
        (every method but those with ``corrects_update``; called after :meth:`coefficients`,
        before :meth:`metrics`)."""
        return None

    # ------------------------------------------------------------------ phase 3
    def token_loss(self, inputs: LossInputs) -> Tensor:
        """The per-token loss ``ℓ_t`` of ``inputs``' shape ``[*]``."""
        raise NotImplementedError(f"{type(self).__name__} defines no token_loss")

    def loss_sums(self, inputs: LossInputs, valid: Tensor, delta_h: Tensor) -> dict[str, Tensor]:
        """Metric numerators of one micro-batch (0-d float64, keys :attr:`loss_sum_names`)."""
        return {}

    def loss_metrics(self, sums: Mapping[str, float], n_tokens: int) -> dict[str, float]:
        """Step metrics from the summed :meth:`loss_sums` of every micro-batch and rank."""
        return {}

    # ------------------------------------------------------------------ state across steps
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state carried from step to step (empty for stateless methods)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint's :meth:`state_dict`: its keys must be those this objective
        would write (else ``ValueError`` naming both), then :meth:`restore` takes the values."""
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(
                f"method {self.config.name!r}: checkpoint state has {sorted(state)}, "
                f"expected {sorted(expected)}"
            )
        self.restore(state)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take the values of a checked :meth:`state_dict` (nothing for stateless methods)."""


def positive(value: float, path: str) -> None:
    require(math.isfinite(value) and value > 0, path, f"must be > 0, got {value}")


def fraction(value: float, path: str) -> None:
    require(0 < value <= 1, path, f"must lie in (0, 1], got {value}")


def non_negative(value: float, path: str) -> None:
    require(math.isfinite(value) and value >= 0, path, f"must be a finite number >= 0, got {value}")
