"""What a method of spec §5 is: a settings dataclass deriving from :class:`MethodConfig` and an
:class:`Objective` registered under the method's name, each hook documented where it is defined
(docs/core.md, "Adding a method")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from opefo_nemo.core.entropy_flow import ESTIMATORS
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs, TokenChunk
from opefo_nemo.core.reduction import BatchReducer
from opefo_nemo.core.schema import one_of, require


@dataclass(frozen=True)
class EntropyFlowConfig:
    """spec §2: the ΔH estimator (every method logs the flows and λ*); a method's own
    ``entropy_flow`` derives from it."""

    estimator: str = "paper"
    """ΔH per token (spec §2), logged for every method as ``flow/*`` and λ*: ``paper`` (Eq. 5 at
    the sampled token) | ``tabular`` (the exact first order of the sampled token's logit step; two
    more vocabulary sums) | ``expectation`` (Eq. 5 averaged over the token drawn from π; has the
    sign of A; four more vocabulary sums)."""

    def validate(self, path: str) -> None:
        """Ranges of the keys under ``path``; a subclass extends it (``super().validate``)."""
        one_of(self.estimator, ESTIMATORS, f"{path}.estimator")


@dataclass(frozen=True)
class MethodConfig:
    """The keys every method accepts, with their defaults; each ``conf/method/<name>.yaml``
    starts from this file and adds the keys of its method's settings dataclass (which derives
    from this one, ``core/objectives/methods/``). An unknown key or an impossible value fails at
    start-up, naming the key. spec §2-§5; adding a method: docs/core.md."""

    name: str
    """The objective's registry key (``core/objectives/methods/``); required."""
    updates_per_rollout: int = 1
    """Optimizer steps per rollout batch: 1 = strict on-policy (ρ ≡ 1); the approximate
    on-policy baselines take 8 sequential mini-batch steps."""
    lr: float = 2.83e-6
    """AdamW peak learning rate (paper: 2.83e-6 = 1e-6 × √8 strict on-policy, one full-batch
    update per rollout; 1e-6 otherwise)."""
    entropy_flow: EntropyFlowConfig = field(default_factory=EntropyFlowConfig)
    """The per-token entropy change and its flows (spec §2, §3)."""

    @property
    def strict_on_policy(self) -> bool:
        """One optimizer step per rollout batch, so ``ρ ≡ 1`` (spec §5)."""
        return self.updates_per_rollout == 1

    @property
    def layout_invariant(self) -> bool:
        """Whether the update is the same, up to rounding, whichever responses share a
        micro-batch (spec §11): every statistic over the optimizer-step batch. A method taking one
        over each micro-batch says no, and keeps the contiguous layout."""
        return True

    def validate(self, prefix: str) -> None:
        """Ranges of the common keys; a subclass extends it (``super().validate(prefix)``)."""
        require(self.updates_per_rollout >= 1, f"{prefix}.updates_per_rollout", "must be >= 1")
        positive(self.lr, f"{prefix}.lr")
        self.entropy_flow.validate(f"{prefix}.entropy_flow")


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
    """A method of spec §5; one instance lives for a whole run. Every method gets, without
    writing anything: ΔH with the configured estimator, the flow sums P and N, λ*, the token-mean
    entropy and their metrics (spec §2, §3, §6), the global token count and the loss as a global
    token mean (spec §5).

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
