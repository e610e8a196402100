"""What :class:`~.policy.MegatronPolicy` checks of the model it is given: weight names, shard
shapes and dtype against the layout, and a tied embedding's two pipeline copies bit-equal."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.fused_output import gpt_model
from opefo_nemo.models.megatron_weights.layout import MegatronLayout
from opefo_nemo.models.megatron_weights.weight_mapping import Sharding, stage_specs

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_model(model: torch.nn.Module, layout: MegatronLayout, dtype: str) -> None:
    """This rank's ``model`` has the weight names and TP shard shapes of its pipeline stage of
    ``layout``, and every parameter is ``dtype`` (``engine.dtype``); ``ValueError`` otherwise."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if tp != layout.tensor_parallel:
        raise ValueError(
            f"parallel_state has tensor parallel {tp}, the layout {layout.tensor_parallel}"
        )
    state = {k: v for k, v in model.state_dict().items() if "_extra_state" not in k}
    stage = parallel_state.get_pipeline_model_parallel_rank()
    expected = {
        spec.name: _shard_shape(spec.shape, spec.sharding, tp)
        for spec in stage_specs(layout, stage)
    }
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    if missing or unexpected:
        raise ValueError(
            f"model weights do not match the layout: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(
                f"model weight {name} has shape {tuple(tensor.shape)}, the layout (padded "
                f"vocabulary {layout.padded_vocab_size}, TP {tp}) expects {expected[name]}"
            )
    wrong = [n for n, p in model.named_parameters() if p.dtype != _DTYPES[dtype]]
    if wrong:
        raise ValueError(f"model weight {wrong[0]} is not engine.dtype={dtype}")


def check_tied_copies(model: torch.nn.Module, pp_group: dist.ProcessGroup) -> None:
    """Tied embeddings at PP > 1: the last stage's ``output_layer.weight`` equals the first
    stage's word embedding bit for bit (their gradients are summed each step by megatron's
    ``finalize_model_grads``, so they stay equal only if they start equal). One all-reduce of
    ``E_first − E_last`` over the embedding group, then the verdict over the pipeline so that
    every stage raises together."""
    group = compat.embedding_group()
    unequal = torch.zeros(1, device=next(model.parameters()).device)
    if group is not None:
        first = parallel_state.is_pipeline_first_stage()
        gpt = gpt_model(model)
        weight = gpt.embedding.word_embeddings.weight if first else gpt.output_layer.weight
        difference = weight.detach().clone() if first else -weight.detach()
        dist.all_reduce(difference, group=group)
        unequal[0] = float(not bool((difference == 0).all()))
    dist.all_reduce(unequal, op=dist.ReduceOp.MAX, group=pp_group)
    if bool(unequal[0] > 0):
        raise ValueError(
            "tied embeddings at pipeline_parallel > 1: the last stage's output_layer.weight "
            "differs from the first stage's embedding.word_embeddings.weight (load the same "
            "weights into both copies)"
        )


def _shard_shape(shape: tuple[int, ...], sharding: Sharding, tp: int) -> tuple[int, ...]:
    """A full Megatron weight's shape on one TP rank (``tensor_parallel.split_for_rank``)."""
    if sharding is Sharding.REPLICATED:
        return shape
    dim = 1 if sharding is Sharding.ROW else 0
    return tuple(n // tp if d == dim else n for d, n in enumerate(shape))
