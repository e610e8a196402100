"""What the trainer needs from a training engine (docs/architecture.md, Protocols): every engine
implements :class:`Policy`, which the trainer (a layer above) drives."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from opefo_nemo.core.objectives import LossOutput
from opefo_nemo.engines.batch import TrainBatch
from opefo_nemo.engines.batch_layout import MicroBatchLayout
from opefo_nemo.parallel import TokenStats

LossFn = Callable[[int, TokenStats], LossOutput]
"""``loss_fn(micro_index, stats_with_grad) -> LossOutput``: the 0-d loss share of one
micro-batch (phase 3) and its metric sums (the keys ``train_step`` is given as ``sum_names``)."""


class EntropyGradient(Protocol):
    """``g = ∇θ H̄`` kept beside the tensors the optimizer updates, from
    :meth:`Policy.capture_entropy_gradient` (the engines' :class:`~.entropy_correction.
    CapturedEntropyGradient`)."""

    def inner_products(self) -> tuple[float, float]:
        """``(⟨g, g⟩, ⟨g, Δθ⟩)`` over the whole model, ``Δθ`` what was applied since the capture
        (every weight counted once; reduced over the engine's ranks, the same on every rank)."""
        ...

    def move(self, alpha: float) -> None:
        """``θ ← θ + α g`` on the optimizer's tensors, and wherever its step would copy them."""
        ...


@dataclass(frozen=True)
class EngineStepResult:
    """What an engine reports of one optimizer step it took (:meth:`Policy.train_step`): the
    pre-clip global gradient norm, the learning rate used, whether the step was skipped because
    the loss or the gradient was not finite, and the ``LossOutput.sums`` of every micro-batch of
    the step added up (over all ranks; empty when skipped). The trainer turns it into the step's
    metrics (``trainer.update``)."""

    grad_norm: float
    lr: float
    skipped: bool
    sums: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """The trained model. Token statistics use the rollout's sampling temperature (spec §1)."""

    @property
    def device(self) -> torch.device:
        """Where ``loss_fn`` receives its statistics: the trainer moves the step's per-token
        tensors there once, before :meth:`train_step`."""
        ...

    @property
    def data_parallel_size(self) -> int:
        """``D``, the data-parallel ranks a layout deals micro-batches to (1 on one device)."""
        ...

    @property
    def sequence_multiple(self) -> int:
        """What the engine rounds every micro-batch's width up to (1: nothing)."""
        ...

    def token_stats(
        self,
        batch: TrainBatch,
        *,
        sums: Sequence[str] = (),
        layout: MicroBatchLayout | None = None,
    ) -> TokenStats:
        """Phase 1: per-token statistics ``[B, T − 1]`` of ``batch`` in its row order, on every
        rank, forward only, no grad; with the vocabulary ``sums`` asked for
        (``parallel.token_stats``), the others ``None``. ``layout`` (its rows cover ``batch``'s
        exactly once): the micro-batches each rank runs, each at its own width; ``None``: the
        engine's own forward-only layout (``engine.batch_layout``, one mini-batch)."""
        ...

    @property
    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        ...

    def train_step(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: LossFn,
        sum_names: Sequence[str],
        owners: Sequence[int] | None = None,
    ) -> EngineStepResult:
        """One optimizer step: for each micro-batch ``i`` a forward with gradient, then
        ``loss_fn(i, stats).loss.backward()`` (the loss is already a share of the global token
        mean, so gradients just accumulate); then clipping and the optimizer step. Every rank is
        given the step's whole list; ``owners[i]``: the data-parallel rank that runs micro-batch
        ``i`` (``MicroBatchLayout.owners``; ``None``: equal contiguous blocks). The returned
        ``sums`` add up every micro-batch's ``LossOutput.sums``, whose keys are ``sum_names``
        (the same on every rank, so an engine can reduce them as one vector)."""
        ...

    def capture_entropy_gradient(
        self,
        micro_batches: Sequence[TrainBatch],
        entropy_fn: LossFn,
        owners: Sequence[int] | None = None,
    ) -> EntropyGradient | None:
        """``g = ∇θ H̄`` before a step: the forwards and backwards of :meth:`train_step` with
        ``entropy_fn(i, stats).loss`` (micro-batch ``i``'s share ``Σ mask·H_t / N`` of the
        batch's token-mean entropy), reduced like the policy gradient (micro-batches,
        data-parallel ranks, TP and PP) and kept, in the optimizer's own layout and precision,
        out of the buffers the next pass reuses; ``None`` (on every rank) when it is not
        finite. The parameters do not change."""
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


@runtime_checkable
class SharedForwardPolicy(Policy, Protocol):
    """A :class:`Policy` whose strict step can run one forward per micro-batch for the statistics
    and the loss (``engine.shared_forward``, the ``hf`` engine): the statistics come with their
    graphs, which the step's backward passes reuse instead of running forwards of their own."""

    @property
    def shares_forward(self) -> bool:
        """Whether the trainer should take a strict step's statistics from
        :meth:`forward_with_graph`."""
        ...

    def forward_with_graph(
        self, micro_batches: Sequence[TrainBatch], sums: Sequence[str] = ()
    ) -> list[TokenStats]:
        """Phase 1 of one optimizer step's micro-batches with the graphs kept, on :attr:`device`
        (the checks of :meth:`token_stats`)."""
        ...

    def capture_entropy_gradient(
        self,
        micro_batches: Sequence[TrainBatch],
        entropy_fn: LossFn,
        owners: Sequence[int] | None = None,
        kept: Sequence[TokenStats] | None = None,
    ) -> EntropyGradient | None:
        """:meth:`Policy.capture_entropy_gradient`; with ``kept``, through its graphs, which stay
        for :meth:`train_step`."""
        ...

    def train_step(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: LossFn,
        sum_names: Sequence[str],
        owners: Sequence[int] | None = None,
        kept: Sequence[TokenStats] | None = None,
    ) -> EngineStepResult:
        """:meth:`Policy.train_step`; with ``kept``, through its graphs (no forward)."""
        ...
