"""``engine.device=cpu``: megatron-core's model, schedules, DDP, optimizers and checkpoints on CPU
ranks over gloo, for laptops and CI (docs/megatron.md, "CPU ranks"). Each redirection below names
the megatron-core lines (0.16.1; 0.11 reads the same unless said) it serves.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

#: CPU tensor type names and the CUDA names megatron's optimizers test for: they sort parameters
#: by ``Tensor.type()`` and refuse anything else (``optimizer/optimizer.py``
#: ``Float16OptimizerWithFloat16Params``, ``optimizer/distrib_optimizer.py``,
#: ``optimizer/clip_grads.py``).
_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
}


@functools.lru_cache(maxsize=32)
def _causal_mask(sq: int) -> torch.Tensor:
    """megatron's default causal mask ``[sq, sq]`` (True above the diagonal), on the CPU.

    ``get_default_causal_mask`` (``transformer/utils.py``, imported by ``fusions/fused_softmax.py``)
    is the one ``device="cuda"`` call that activation recomputation runs again inside the
    backward, where no ``TorchFunctionMode`` is active (a mode is suspended while its own handler
    runs, here around ``torch.autograd.backward``), so it is replaced rather than redirected."""
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


#: Non-empty while a :func:`megatron_on_cpu` block is active (re-entry changes nothing).
_ACTIVE: list[bool] = []


class _CudaOnCpu(TorchFunctionMode):
    """``device="cuda…"`` keywords become ``"cpu"``, ``Tensor.cuda()`` keeps the tensor where it
    is, ``Tensor.type()`` answers the CUDA type name."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # 0.11's schedules (``torch.tensor(0).cuda()``) and ``language_module.py``
        # ``setup_embeddings_and_output_layer`` (a tied output layer at PP > 1).
        if func is torch.Tensor.cuda:
            return args[0]
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        # ``pipeline_parallel/schedules.py`` ``total_num_tokens``; ``transformer/utils.py``
        # ``get_default_causal_mask``; ``optimizer/optimizer.py`` ``found_inf`` / ``_scale_one`` /
        # ``_dummy_overflow_buf``; ``optimizer/clip_grads.py`` ``total_norm_cuda``.
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        result = func(*args, **kwargs)
        # Only the query ``Tensor.type()``; a conversion ``Tensor.type(dtype)`` is untouched.
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _CUDA_TYPE_NAMES.get(result, result)
        return result


@contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Points megatron-core's CUDA requests that have nothing to do with the math (on a CPU-only
    torch they raise "Torch not compiled with CUDA enabled") at the CPU for the ``with`` block,
    and changes nothing else: the model, the schedules' loops, the collectives and the optimizers'
    arithmetic run as shipped (without Transformer Engine or apex megatron's optimizer is
    ``torch.optim.AdamW`` and its norm and scaling ``megatron.core.utils``' multi-tensor
    fallbacks: plain torch). Everything is restored at the block's end. Enter it after
    ``parallel_state.initialize_model_parallel``. Re-entrant: an inner block inside an outer one
    changes nothing."""
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random
    from megatron.core.transformer import utils

    if _ACTIVE:
        yield
        return

    patches = [
        (torch.Tensor, "cuda", lambda self, *args, **kwargs: self),
        # ``utils.py`` ``GlobalMemoryBuffer``; the p2p receive buffers
        # (``pipeline_parallel/p2p_communication.py``); DDP's flat parameter and gradient buffers
        # (``distributed/param_and_grad_buffer.py``); the distributed optimizer's gather buffers;
        # ``dist_checkpointing``'s failure flag (``strategies/state_dict_saver.py``); the
        # sequence-parallel gather/scatter buffers (``tensor_parallel/mappings.py``).
        (torch.cuda, "current_device", lambda: "cpu"),
        # After gloo's ``batch_isend_irecv`` (complete once waited on: the activations' and,
        # with ``variable_seq_lengths``, their shapes' ``_communicate_shapes``) and in
        # ``dist_checkpointing``'s ``preload_tensors``.
        (torch.cuda, "synchronize", lambda *args, **kwargs: None),
        # The RNG tracker (``tensor_parallel/random.py``) saves and restores the CPU RNG state
        # instead of the CUDA one around dropout.
        (random, "_get_cuda_rng_state", lambda *args, **kwargs: torch.get_rng_state()),
        (random, "_set_cuda_rng_state", lambda state, *args, **kwargs: torch.set_rng_state(state)),
        (utils, "get_default_causal_mask", _causal_mask),
        (fused_softmax, "get_default_causal_mask", _causal_mask),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    tracker = random.get_cuda_rng_tracker()
    tracker.states_[random._MODEL_PARALLEL_RNG_TRACKER_NAME] = torch.get_rng_state()
    _ACTIVE.append(True)
    try:
        with _CudaOnCpu():
            yield
    finally:
        _ACTIVE.pop()
        tracker.reset()
        for owner, name, original in saved:
            setattr(owner, name, original)
