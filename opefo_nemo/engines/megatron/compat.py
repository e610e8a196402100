"""What differs between the megatron-core releases the engine runs on, 0.11 (the NeMo 25.02 image's)
and 0.16.1, decided by looking at the installed package, never by comparing version strings
(docs/megatron.md, "megatron-core versions"). Every function imports megatron lazily, so this
module imports on a machine without it (the preflight on a login node).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch.distributed as dist


def _accepts(function: Callable[..., Any], parameter: str) -> bool:
    return parameter in inspect.signature(function).parameters


def initialize_model_parallel(
    tensor_parallel: int, pipeline_parallel: int, *, gloo_groups: bool
) -> None:
    """``parallel_state.initialize_model_parallel(tensor_parallel, pipeline_parallel)``, with
    megatron's gloo copies of the data-parallel groups only when ``gloo_groups`` (the
    distributed optimizer's ``get_megatron_optimizer`` needs them).

    0.16.1 takes ``create_gloo_process_groups``; 0.11 has no such parameter and always creates
    them (``gloo_groups=False`` costs it a few extra gloo groups, nothing else)."""
    from megatron.core import parallel_state

    initialize = parallel_state.initialize_model_parallel
    options: dict[str, Any] = {}
    if _accepts(initialize, "create_gloo_process_groups"):
        options["create_gloo_process_groups"] = gloo_groups
    initialize(tensor_parallel, pipeline_parallel, **options)


def embedding_group() -> dist.ProcessGroup | None:
    """megatron's embedding group (the first and last pipeline stage) of this rank, or ``None``
    on a rank outside it (a middle pipeline stage).

    0.16.1's ``get_embedding_group(check_initialized=False)`` returns ``None`` there; 0.11's
    ``get_embedding_group()`` has no such parameter and asserts. Both releases answer
    ``is_rank_in_embedding_group(ignore_virtual=True)`` from the ranks recorded with the group,
    so that test decides, the same way on both."""
    from megatron.core import parallel_state

    if not parallel_state.is_rank_in_embedding_group(ignore_virtual=True):
        return None
    return parallel_state.get_embedding_group()


@functools.cache
def tensor_parallel_above_kv_heads() -> bool | None:
    """Whether the installed megatron-core builds attention with tensor parallel larger than the
    key/value heads (``num_query_groups``), each group replicated over ``TP / groups`` ranks;
    ``None`` when megatron-core cannot be imported here.

    0.16.1's ``TransformerConfig`` accepts a ``num_query_groups`` that divides the TP size and
    its attention replicates the groups; 0.11's ``TransformerConfig.__post_init__`` raises
    ``ValueError`` unless TP divides ``num_query_groups``. The answer is that constructor's, on
    a one-layer config with 2 heads in 1 group at TP 2 (no process group, no tensor is made)."""
    try:
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError:
        return None
    try:
        TransformerConfig(
            num_layers=1,
            hidden_size=8,
            num_attention_heads=2,
            num_query_groups=1,
            tensor_model_parallel_size=2,
        )
    except ValueError:
        return False
    return True


def tensor_parallel_problem(tensor_parallel: int, num_key_value_heads: int) -> str | None:
    """The start-up rule (preflight and the trainer): tensor parallel above the model's
    key/value heads where :func:`tensor_parallel_above_kv_heads` says the installed
    megatron-core cannot run it. Where megatron-core does not import (a login node) the rule
    assumes the megatron-core the jobs run on, the NeMo 25.02 image's 0.11, and says so.
    ``None`` when the layout is fine."""
    if tensor_parallel <= num_key_value_heads:
        return None
    supported = tensor_parallel_above_kv_heads()
    if supported:
        return None
    if supported is False:
        which = (
            "the installed megatron-core requires tensor parallel to divide the key/value heads "
            "(as 0.11 does; 0.16.1 replicates them)"
        )
    else:
        which = (
            "megatron-core is not importable here, so this assumes the NeMo 25.02 image's 0.11, "
            "which requires tensor parallel to divide the key/value heads"
        )
    return (
        f"engine.tensor_model_parallel_size = {tensor_parallel} exceeds the model's "
        f"num_key_value_heads = {num_key_value_heads}: {which}; use a tensor parallel size "
        f"that divides {num_key_value_heads}"
    )


def local_layer_spec(*, qk_layernorm: bool, norm: type | None = None):
    """megatron-core's local (Transformer-Engine-free) GPT layer spec with RMSNorm (every model
    family the engine maps), ``qk_layernorm`` for Qwen3's q/k norms, and ``norm`` (when given)
    in every norm slot (input, pre-MLP, q/k).

    0.16.1's ``get_gpt_layer_local_spec`` takes ``normalization="RMSNorm"`` and puts torch's
    norm (``WrappedTorchNorm``, RMSNorm from the config) in every norm slot. 0.11's has no such
    parameter: its slots hold apex's ``FusedLayerNorm`` when apex imports (the NeMo image),
    which refuses anything but LayerNorm, and ``WrappedTorchNorm`` otherwise; there the slots
    are set to ``WrappedTorchNorm`` unless ``norm`` is given."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if _accepts(get_gpt_layer_local_spec, "normalization"):
        spec = get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization="RMSNorm")  # type: ignore[call-arg, unused-ignore]  # 0.16.1 only (branch)
        if norm is None:
            return spec
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=qk_layernorm)
    chosen = norm if norm is not None else WrappedTorchNorm

    def replace(slot: object) -> object:
        return slot if slot is IdentityOp else chosen

    layer: Any = spec.submodules  # ModuleSpec annotates submodules as object
    attention = layer.self_attention.submodules
    attention.q_layernorm = replace(attention.q_layernorm)
    attention.k_layernorm = replace(attention.k_layernorm)
    layer.input_layernorm = replace(layer.input_layernorm)
    layer.pre_mlp_layernorm = replace(layer.pre_mlp_layernorm)
    return spec


def optimizer_sharded_state(optimizer: Any, model_state: dict, is_loading: bool) -> dict:
    """A ``MegatronOptimizer``'s ``sharded_state_dict`` for ``dist_checkpointing``.

    0.16.1 chooses the distributed optimizer's format through ``metadata`` and no longer saves
    its older default ``fully_sharded_model_space`` (flattened ranges are refused); its
    ``fully_reshardable`` format cannot load into torch's AdamW (the per-parameter ``step`` the
    CPU fallback keeps is missing from it), so the engine asks for ``dp_reshardable``: each
    rank's flat optimizer buffers as they are, resumable at the same TP × PP layout (DP may
    change). 0.11 has no ``metadata`` parameter; its default is ``fully_sharded_model_space``."""
    method = optimizer.sharded_state_dict
    if _accepts(method, "metadata") or _accepts(method, "kwargs"):
        metadata = {"distrib_optim_sharding_type": "dp_reshardable"}
        return method(model_state, is_loading, metadata=metadata)
    return method(model_state, is_loading)


def distributed_optimizer_checkpoint_problem() -> str | None:
    """Why this megatron-core cannot checkpoint its distributed optimizer here, or ``None``.

    Without apex or Transformer Engine megatron's optimizer is torch's AdamW, which keeps a
    per-parameter ``step`` tensor. 0.11's distributed-optimizer formats all treat every
    per-parameter state as a slice of the flat buffers and fail on it (in the NeMo image apex
    and Transformer Engine are present, and its fused Adam keeps no such state); 0.16.1's
    ``dp_reshardable`` format handles it."""
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE or _accepts(
        distrib_optimizer.DistributedOptimizer.sharded_state_dict, "metadata"
    ):
        return None
    return (
        "this megatron-core (no 'metadata' in DistributedOptimizer.sharded_state_dict: 0.11) "
        "cannot checkpoint its distributed optimizer over torch's AdamW, its fallback without "
        "apex or Transformer Engine (CPU ranks); set engine.use_distributed_optimizer=false "
        "there, or install apex / Transformer Engine"
    )


def inner_optimizers(optimizer: Any) -> list[Any]:
    """The ``MegatronOptimizer`` objects that each own parameter groups: a ``ChainedOptimizer``'s
    ``chained_optimizers`` (0.16.1's ``get_megatron_optimizer`` always returns one) or the
    optimizer itself (0.11 returns it unchained when there is one)."""
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def copy_main_weights_to_model(optimizer: Any) -> None:
    """After the main (fp32) weights changed outside the optimizer's step: what its step does
    next, for each inner optimizer. Both releases name it ``_copy_main_params_to_model_params``
    (the mixed-precision and the distributed optimizer: main weights into the model's bf16 or
    fp32 parameters, the distributed optimizer's into this rank's range of its parameter
    buffer); the fp32 optimizer has none (its main weights are the parameters). The distributed
    optimizer's step then all-gathers the parameter buffer over data parallel with each model
    chunk's ``start_param_sync`` (both releases; synchronous unless ``overlap_param_gather``,
    which the engine does not set)."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for inner in inner_optimizers(optimizer):
        copy = getattr(inner, "_copy_main_params_to_model_params", None)
        if copy is not None:
            copy()
        if isinstance(inner, DistributedOptimizer):
            for chunk in inner.model_chunks:
                cast(DistributedDataParallel, chunk).start_param_sync(force_sync=True)
