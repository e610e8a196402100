"""What the trainer needs from a training engine (docs/architecture.md, Protocols).

Every engine (``hf``, ``megatron``, ``aligner``) implements :class:`Policy`; the loop in
:mod:`opefo_nemo.trainer.loop` drives them only through it, so they are interchangeable. It lives
here, beside the engines, because imports point down the layer list: the trainer uses it, the
engines implement it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from ..core.objectives import LossOutput
from ..core.update_correction import CorrectionResult
from ..parallel import TokenStats
from .batch import TrainBatch

LossFn = Callable[[int, TokenStats], LossOutput]
"""``loss_fn(micro_index, stats_with_grad) -> LossOutput``: the 0-d loss share of one
micro-batch (phase 3) and its metric sums (the keys ``train_step`` is given as ``sum_names``)."""


@dataclass(frozen=True)
class EntropyCorrection:
    """Asks :meth:`Policy.train_step` to correct the update it applies (spec §3, "Exact first
    order"; :mod:`opefo_nemo.core.update_correction`).

    Before the step, ``g = ∇θ H̄``: a forward and backward of every micro-batch with
    ``entropy_fn(i, stats_with_grad).loss`` (micro-batch ``i``'s share ``Σ mask·H_t / N`` of the
    batch's token-mean entropy), reduced like the policy gradient (over micro-batches,
    data-parallel ranks, TP and PP), kept in the optimizer's own layout and precision (fp32
    main weights, shards of the distributed optimizer). After the step, with the update
    ``Δθ`` the optimizer applied: ``θ ← θ + α g`` so that ``⟨g, Δθ + α g⟩ = target``; the sums
    cost two all-reduces of float64 scalars, nothing is gathered."""

    entropy_fn: LossFn
    target: float


@dataclass(frozen=True)
class UpdateResult:
    """Outcome of one optimizer step: the pre-clip global gradient norm, the learning rate used,
    whether the step was skipped because the loss or the gradient (or with a correction, the
    entropy gradient) was not finite, the ``LossOutput.sums`` of every micro-batch of the step
    added up (over all ranks; empty when skipped), and the correction when one was asked."""

    grad_norm: float
    lr: float
    skipped: bool
    sums: dict[str, float] = field(default_factory=dict)
    correction: CorrectionResult | None = None


@runtime_checkable
class Policy(Protocol):
    """The trained model. Token statistics use the rollout's sampling temperature (spec §1)."""

    @property
    def device(self) -> torch.device:
        """Where ``loss_fn`` receives its statistics: the trainer moves the step's per-token
        tensors there once, before :meth:`train_step`."""
        ...

    def token_stats(self, batch: TrainBatch, *, sums: Sequence[str] = ()) -> TokenStats:
        """Phase 1: per-token statistics ``[B, T − 1]`` of ``batch``, forward only, no grad; with
        the vocabulary ``sums`` asked for (``parallel.token_stats``), the others ``None``."""
        ...

    def train_step(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: LossFn,
        sum_names: Sequence[str],
        correction: EntropyCorrection | None = None,
    ) -> UpdateResult:
        """One optimizer step: for each micro-batch ``i`` a forward with gradient, then
        ``loss_fn(i, stats).loss.backward()`` (the loss is already a share of the global token
        mean, so gradients just accumulate); then clipping and the optimizer step. The returned
        ``sums`` add up every micro-batch's ``LossOutput.sums``, whose keys are ``sum_names``
        (the same on every rank, so an engine can reduce them as one vector). With a
        ``correction``, the entropy gradient's pass runs first and the step's update is
        corrected after the optimizer step (:class:`EntropyCorrection`)."""
        ...

    def advance_schedule(self) -> None:
        """End of a rollout step: move the learning-rate schedule on by one (spec §8)."""
        ...

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """Every weight under its Hugging Face name, for the rollout engine."""
        ...

    def save(self, directory: Path) -> None:
        """Model, optimizer and scheduler state into ``directory``."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote."""
        ...
