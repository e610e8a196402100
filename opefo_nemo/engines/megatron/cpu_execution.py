"""``engine.device=cpu``: megatron-core's model, schedules, DDP, optimizers and checkpoints on CPU
ranks over gloo, for laptops and CI (docs/megatron.md, "CPU ranks").

megatron-core asks for CUDA in a handful of places that have nothing to do with the math. On a
CPU-only torch they raise "Torch not compiled with CUDA enabled". :func:`megatron_on_cpu` points
exactly these at the CPU for the ``with`` block, and changes nothing else (the model, the
schedules' loops, the collectives, the optimizers' arithmetic run as shipped). Each redirection
and the megatron-core lines (0.16.1; 0.11 reads the same unless said) it serves:

- ``device="cuda…"`` keywords of torch calls become ``"cpu"`` (a ``TorchFunctionMode``):
  ``pipeline_parallel/schedules.py`` ``total_num_tokens``; ``transformer/utils.py``
  ``get_default_causal_mask``; ``optimizer/optimizer.py`` ``found_inf`` / ``_scale_one`` /
  ``_dummy_overflow_buf``; ``optimizer/clip_grads.py`` ``total_norm_cuda``.
- ``Tensor.cuda()`` returns the tensor itself: 0.11's schedules (``torch.tensor(0).cuda()``) and
  ``language_module.py`` ``setup_embeddings_and_output_layer`` (a tied output layer at PP > 1).
- ``torch.cuda.current_device()`` answers ``"cpu"``: ``utils.py`` ``GlobalMemoryBuffer``; the
  p2p receive buffers (``pipeline_parallel/p2p_communication.py``); DDP's flat parameter and
  gradient buffers (``distributed/param_and_grad_buffer.py``); the distributed optimizer's gather
  buffers; ``dist_checkpointing``'s failure flag (``strategies/state_dict_saver.py``); the
  sequence-parallel gather/scatter buffers (``tensor_parallel/mappings.py``).
- ``torch.cuda.synchronize()`` does nothing: after gloo's ``batch_isend_irecv`` (complete once
  waited on) and in ``dist_checkpointing``'s ``preload_tensors``.
- The RNG tracker (``tensor_parallel/random.py``) saves and restores the CPU RNG state instead of
  the CUDA one around dropout.
- ``Tensor.type()`` without arguments answers the CUDA type name (``"torch.cuda.FloatTensor"``
  for ``"torch.FloatTensor"``, likewise bf16 / fp16): the optimizers sort parameters by that
  string and refuse anything else (``optimizer/optimizer.py``
  ``Float16OptimizerWithFloat16Params``, ``optimizer/distrib_optimizer.py``,
  ``optimizer/clip_grads.py``). ``Tensor.type(dtype)`` (a conversion) is untouched.

- ``get_default_causal_mask`` (``transformer/utils.py``, imported by ``fusions/fused_softmax.py``)
  builds the mask on the CPU. It is the one ``device="cuda"`` call that activation
  recomputation runs again inside the backward, where no ``TorchFunctionMode`` is active (a mode
  is suspended while its own handler runs, here around ``torch.autograd.backward``).

Without Transformer Engine or apex, megatron's optimizer is ``torch.optim.AdamW`` and its norm and
scaling ``megatron.core.utils``' multi-tensor fallbacks: plain torch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

#: CPU tensor type names and the CUDA names megatron's optimizers test for.
_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
}


@functools.lru_cache(maxsize=32)
def _causal_mask(sq: int) -> torch.Tensor:
    """megatron's default causal mask ``[sq, sq]`` (True above the diagonal), on the CPU."""
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


#: Non-empty while a :func:`megatron_on_cpu` block is active (re-entry changes nothing).
_ACTIVE: list[bool] = []


class _CudaOnCpu(TorchFunctionMode):
    """``device="cuda…"`` keywords become ``"cpu"``, ``Tensor.cuda()`` keeps the tensor where it
    is, ``Tensor.type()`` answers the CUDA type name (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cuda:
            return args[0]
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        result = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _CUDA_TYPE_NAMES.get(result, result)
        return result


@contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """The module docstring's redirections for the ``with`` block; everything is restored at its
    end. Enter it after ``parallel_state.initialize_model_parallel``. Re-entrant: an inner block
    inside an outer one changes nothing."""
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random
    from megatron.core.transformer import utils

    if _ACTIVE:
        yield
        return

    patches = [
        (torch.Tensor, "cuda", lambda self, *args, **kwargs: self),
        (torch.cuda, "current_device", lambda: "cpu"),
        (torch.cuda, "synchronize", lambda *args, **kwargs: None),
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
