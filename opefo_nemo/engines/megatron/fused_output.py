"""``engine.stats_kernel=fused_linear``: the token statistics straight from the final hidden states
and the output weight, so the ``[tokens, V/TP]`` logits never reach memory (docs/kernels.md, "In
``engine=megatron``")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.parallel import TokenStats

if TYPE_CHECKING:
    from megatron.core.models.gpt.gpt_model import GPTModel


def gpt_model(model: torch.nn.Module) -> GPTModel:
    """The ``GPTModel`` inside megatron's ``DistributedDataParallel`` wrapper (or ``model``)."""
    return cast("GPTModel", getattr(model, "module", model))


@contextmanager
def stop_before_output_layer(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``model(...)`` returns the final hidden states ``[s, b, h]`` (``[s/TP,
    b, h]`` under sequence parallelism; final norm applied) instead of the logits: megatron-core's
    ``GPTModel`` (0.11 and 0.16.1, ``models/gpt/gpt_model.py``) skips its ``output_layer`` when
    ``post_process`` is false, as for a middle pipeline stage. The flag is restored on exit."""
    gpt = gpt_model(model)
    saved = gpt.post_process
    gpt.post_process = False
    try:
        yield
    finally:
        gpt.post_process = saved


def output_weight(model: torch.nn.Module) -> Tensor:
    """The weight ``[V/TP, h]`` the model's output layer multiplies by on this rank: with tied
    embeddings the word embedding (on a pipeline's last stage, the output layer's copy of it). Its
    gradient reaches ``param.grad``, where megatron's DDP hooks pick it up as any other weight's."""
    gpt = gpt_model(model)
    if gpt.share_embeddings_and_output_weights:
        return gpt.shared_embedding_or_output_weight()
    return gpt.output_layer.weight


class FusedOutputStats:
    """Per-token statistics of ``softmax(X Wᵀ / T)`` from the last stage's final hidden states
    ``X`` ``[s, b, h]``: ``tp_group`` (``None``: TP 1), ``vocab_size`` (true,
    padding excluded), ``temperature`` and ``sequence_parallel`` as the model was built.

    ``stops_before_output_layer`` tells the forward step to run the model under
    :func:`stop_before_output_layer`; ``stats`` has the signature of
    :meth:`~.loss_closure.VocabParallelLogits.stats`."""

    stops_before_output_layer = True

    def __init__(
        self,
        model: torch.nn.Module,
        tp_group: dist.ProcessGroup | None,
        vocab_size: int,
        temperature: float,
        sequence_parallel: bool,
    ) -> None:
        self.model = model
        self.tp_group = tp_group
        self.vocab_size = vocab_size
        self.temperature = temperature
        self.sequence_parallel = sequence_parallel

    def stats(self, hidden: Tensor, targets: Tensor, sums: Sequence[str] = ()) -> TokenStats:
        """Per-token statistics ``[batch, seq]`` of ``targets`` (``[batch, seq]`` int64) with the
        vocabulary ``sums`` asked for; ``logprob`` and ``entropy`` differentiable w.r.t. the
        hidden states and the output weight."""
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            gather_from_sequence_parallel_region,
        )

        from opefo_nemo.parallel.linear_stats import linear_token_stats

        if hidden.dim() != 3:
            raise ValueError(f"expected hidden states [s, b, h], got shape {tuple(hidden.shape)}")
        # What the output layer's ``ColumnParallelLinear`` does with its input, so every TP rank
        # holds the full ``[s, b, h]`` and its backward sums ``∂L/∂X = Σ_r (∂L/∂Z_r) W_r`` over
        # the ranks: all-gather of the sequence (backward: reduce-scatter) under sequence
        # parallelism, else identity (backward: all-reduce).
        if self.sequence_parallel:
            full = gather_from_sequence_parallel_region(hidden, True)
        else:
            full = copy_to_tensor_model_parallel_region(hidden)
        stats = linear_token_stats(
            full,
            output_weight(self.model),
            targets.t(),
            temperature=self.temperature,
            group=self.tp_group,
            vocab_size=self.vocab_size,
            sums=sums,
        )
        return stats.map(Tensor.t)
