"""Gradient reduction, global norm and clipping for a Megatron model chunk on plain torch.

What megatron-core's ``DistributedDataParallel`` + ``MegatronOptimizer`` do on the GPU, written
for any device so that the CPU tests run it for real:

- :func:`average_over_data_parallel`: DDP's reduction of a dense model: every gradient scaled by
  ``1 / dp_size`` and summed over the data-parallel group (one all-reduce of one flat buffer).
  Combined with :class:`~.loss_closure.MegatronScaling` (which multiplies each micro-batch's loss
  by ``num_microbatches × dp_size``) the result is the full-batch gradient of spec §5. Then
  :func:`sum_tied_embedding_grads`, as megatron's ``finalize_model_grads`` follows DDP's
  reduction with ``_allreduce_word_embedding_grads``.
- :func:`sum_tied_embedding_grads`: with tied embeddings at PP > 1 the word embedding ``E`` lives
  twice, as the first stage's ``embedding.word_embeddings.weight`` (input lookup) and the last
  stage's ``output_layer.weight`` (logits ``h Eᵀ``), both marked ``shared_embedding`` by
  megatron. ``∂L/∂E`` is the sum of the two uses' gradients, so both copies get
  ``g_first + g_last`` (one all-reduce over megatron's embedding group, the first and last stage
  of each pipeline); starting equal, the copies then take identical optimizer steps.
- :func:`global_grad_norm`: ``‖g‖₂`` of the whole model (all TP shards, all PP stages), every
  weight counted once: a tensor-parallel-split weight once per shard (each TP rank holds a
  different slice), a TP-replicated weight (norms) only on TP rank 0, and a pipeline-shared
  weight (the last stage's copy of a tied embedding, ``param.shared``) only where it is not
  marked shared. Squares are summed over the model-parallel group (TP × PP), megatron's
  ``get_grad_norm_fp32`` rule (``optimizer/clip_grads.py``, which needs CUDA itself).
- :func:`clip_to_norm`: ``g ← g · min(1, max_norm / (‖g‖ + 1e-6))``, the coefficient of
  ``torch.nn.utils.clip_grad_norm_`` (and of megatron's ``clip_grad_by_total_norm_fp32``).

A ``failed`` flag (a micro-batch with a non-finite loss or logits on some rank) travels in the
same collectives, so every rank learns it without an extra one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from torch import Tensor

from . import compat


def _grad_or_zeros(param: torch.nn.Parameter) -> Tensor:
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    return param.grad


def average_over_data_parallel(
    params: Sequence[torch.nn.Parameter], group: dist.ProcessGroup, failed: bool
) -> bool:
    """Replace every ``param.grad`` by its data-parallel average (a missing gradient counts as
    zeros, so every rank sends the same buffer), then sum a tied embedding's copies over the
    pipeline's first and last stage (:func:`sum_tied_embedding_grads`); returns whether any
    rank ``failed``."""
    size = dist.get_world_size(group)
    grads = [_grad_or_zeros(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads] + [_flag(failed, grads)])
    if size > 1:
        flat[:-1] /= size
        dist.all_reduce(flat, group=group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    sum_tied_embedding_grads(params, compat.embedding_group())
    return bool(flat[-1] > 0)


def sum_tied_embedding_grads(
    params: Sequence[torch.nn.Parameter], embedding_group: dist.ProcessGroup | None
) -> None:
    """``g ← g_first + g_last`` for the copy of a tied word embedding among ``params`` (module
    docstring), all-reduced over ``embedding_group`` (:func:`~.compat.embedding_group`: ``None`` on
    the middle stages). Nothing to do without such a copy (untied embeddings, PP 1,
    a middle stage) or with a group of one rank."""
    tied = [p for p in params if getattr(p, "shared_embedding", False)]
    if not tied or embedding_group is None or dist.get_world_size(embedding_group) == 1:
        return
    if len(tied) > 1:
        raise ValueError(
            f"{len(tied)} parameters are marked shared_embedding; a pipeline stage holds at most "
            "one copy of the tied word embedding (no virtual pipeline stages)"
        )
    dist.all_reduce(_grad_or_zeros(tied[0]), group=embedding_group)


def global_grad_norm(
    params: Sequence[torch.nn.Parameter], model_parallel_group: dist.ProcessGroup, failed: bool
) -> tuple[float, bool]:
    """``(‖g‖₂ of the whole model, whether any rank failed)``; see the module docstring for which
    shard of which weight counts. The squares are summed in float64."""
    squares = [
        p.grad.double().pow(2).sum()
        for p in params
        if p.grad is not None
        and param_is_not_shared(p)
        and param_is_not_tensor_parallel_duplicate(p)
    ]
    total = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)
    packed = torch.stack([total, torch.tensor(float(failed), dtype=torch.float64)])
    if dist.get_world_size(model_parallel_group) > 1:
        dist.all_reduce(packed, group=model_parallel_group)
    return math.sqrt(float(packed[0])), bool(packed[1])


def clip_to_norm(params: Sequence[torch.nn.Parameter], max_norm: float, total_norm: float) -> None:
    """Scale every gradient by ``min(1, max_norm / (total_norm + 1e-6))`` in place."""
    coefficient = max_norm / (total_norm + 1e-6)
    if coefficient < 1.0:
        for param in params:
            if param.grad is not None:
                param.grad.mul_(coefficient)


def _flag(failed: bool, like: Sequence[Tensor]) -> Tensor:
    device = like[0].device if like else torch.device("cpu")
    return torch.tensor([float(failed)], device=device)
