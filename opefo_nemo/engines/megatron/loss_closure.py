"""Loss and token-stats functions for megatron-core's ``forward_backward_func`` (spec §1, §5): the
last stage's ``fn(output)`` on vocab-parallel logits (or, with ``engine.stats_kernel=fused_linear``,
the final hidden states), and the scaling that undoes megatron's own averaging. How the schedule
calls them and why the gradient comes out the full-batch one: docs/megatron.md, "One step's data
path"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.megatron.fused_output import FusedOutputStats
from opefo_nemo.kernels import FUSED_LINEAR
from opefo_nemo.parallel import TokenStats, token_stats

LossFunction = Callable[[Tensor], tuple[Tensor, dict[str, Tensor]]]
"""What ``forward_step_func`` returns beside the model output: ``fn(output) -> (loss, reduced)``,
``output`` the logits or, for :class:`~.fused_output.FusedOutputStats`, the final hidden states."""


class OutputStats(Protocol):
    """Token statistics of the last stage's model output: :class:`VocabParallelLogits` (from the
    logits) or :class:`~.fused_output.FusedOutputStats` (from the final hidden states, with the
    output layer fused into the kernel; ``stops_before_output_layer``)."""

    stops_before_output_layer: bool

    def stats(self, output: Tensor, targets: Tensor, sums: Sequence[str] = ()) -> TokenStats: ...


@dataclass(frozen=True)
class MegatronScaling:
    """megatron-core's own scaling of a 2-tuple ``(loss, reduced)`` loss, to be undone: the schedule
    divides the loss by ``num_microbatches`` and DDP averages the gradients over DP (it only sums
    with ``calculate_per_token_loss``, and ``finalize_model_grads`` then divides by the schedule's
    token count, which stays 0 for 2-tuple returns). Each micro-batch's ``policy_loss`` is already
    its share ``Σ ℓ_t / N_global``, so multiplying it by :attr:`factor` leaves the full-batch
    gradient for any micro-batch and DP size (docs/megatron.md, "One step's data path").

    ``num_microbatches``: micro-batches of this rank in the step (the schedule's argument).
    ``data_parallel_size``: ranks the DDP wrapper averages over. ``calculate_per_token_loss``:
    the model config's flag of that name (DDP then sums instead of averaging).
    """

    num_microbatches: int
    data_parallel_size: int
    calculate_per_token_loss: bool = False

    def __post_init__(self) -> None:
        for name in ("num_microbatches", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"MegatronScaling.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def factor(self) -> float:
        """What the loss share is multiplied by so that megatron's divisions cancel."""
        dp = 1 if self.calculate_per_token_loss else self.data_parallel_size
        return float(self.num_microbatches * dp)


@dataclass(frozen=True)
class VocabParallelLogits:
    """How to read this model's logits: the TP group they are split over (``None``: TP 1), the
    true vocabulary size (padded columns excluded, spec §1), the sampling temperature, the
    token-stats chunk (``None``: default), the layout (``sequence_first``: ``[s, b, V/TP]``) and
    the ``token_stats`` kernel (``auto``: Triton on CUDA when it imports, else torch).
    ``stops_before_output_layer`` is false: the model runs to its logits (``engine.stats_kernel
    =fused_linear`` uses :class:`~.fused_output.FusedOutputStats` instead)."""

    stops_before_output_layer = False

    tp_group: dist.ProcessGroup | None
    vocab_size: int
    temperature: float = 1.0
    chunk_size: int | None = None
    sequence_first: bool = False
    kernel: str = "auto"

    def stats(self, logits: Tensor, targets: Tensor, sums: Sequence[str] = ()) -> TokenStats:
        """Per-token statistics ``[batch, seq]`` of ``targets`` (``[batch, seq]`` int64), with
        the vocabulary ``sums`` asked for (``token_stats``)."""
        if logits.dim() != 3:
            raise ValueError(f"expected 3-d vocab-parallel logits, got shape {tuple(logits.shape)}")
        # Sequence-first logits: transpose the small int64 targets, never the logits
        # (``token_stats`` flattens them to ``[tokens, V/TP]``, which would copy a transposed view).
        arranged = targets.t() if self.sequence_first else targets
        stats = token_stats(
            logits,
            arranged,
            temperature=self.temperature,
            group=self.tp_group,
            vocab_size=self.vocab_size,
            sums=sums,
            chunk_size=self.chunk_size,
            kernel=self.kernel,
        )
        if not self.sequence_first:
            return stats
        return stats.map(Tensor.t)


def output_stats(
    model: torch.nn.Module,
    tp_group: dist.ProcessGroup | None,
    vocab_size: int,
    temperature: float,
    config: MegatronEngineConfig,
) -> OutputStats:
    """How the last stage turns its model output into token statistics: from the final hidden
    states with the output layer fused in (``engine.stats_kernel=fused_linear``), else from the
    vocab-parallel logits with the ``token_stats`` kernel the key names."""
    if config.stats_kernel == FUSED_LINEAR:
        return FusedOutputStats(model, tp_group, vocab_size, temperature, config.sequence_parallel)
    return VocabParallelLogits(
        tp_group,
        vocab_size,
        temperature,
        chunk_size=config.stats_chunk_tokens,
        kernel=config.stats_kernel,
    )


def stats_function(targets: Tensor, outputs: OutputStats, sums: Sequence[str] = ()) -> LossFunction:
    """The token-stats pass's function for ``forward_backward_func(forward_only=True)`` (phase 1).

    ``fn(output) -> (0, reduced)`` with ``reduced`` = ``logprob``, ``entropy`` and the vocabulary
    ``sums`` asked for, each ``[batch, seq]`` fp32, computed without gradient; the schedule
    collects one such mapping per micro-batch, in order.
    """

    def compute(output: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        with torch.no_grad():
            stats = outputs.stats(output, targets, sums)
        return torch.zeros((), device=output.device), stats.present()

    return compute
