"""Run megatron-core's ``DistributedDataParallel`` and the optimizers of
``get_megatron_optimizer`` (fp32, bf16 with fp32 main weights, distributed optimizer) on CPU,
on top of :func:`~.cpu_megatron.megatron_on_cpu`, in a spawned test rank only (0.16.1 and 0.11:
the lines below read the same in both).

``megatron_on_cpu`` already points ``torch.cuda.current_device()`` at the CPU, which covers the
DDP's flat parameter and gradient buffers (``distributed/param_and_grad_buffer.py``
``_ParamAndGradBuffer.__init__``: ``param_data`` / ``grad_data`` are ``torch.zeros(...,
device=torch.cuda.current_device())``) and the distributed optimizer's gather buffers. What it
adds, each for one line megatron hard-codes:

- ``Tensor.type()`` without arguments answers the CUDA type name of a CPU tensor
  (``"torch.cuda.FloatTensor"`` for ``"torch.FloatTensor"``, likewise bf16 / fp16). The
  optimizers sort parameters by that string and raise ``TypeError`` for anything else:
  ``optimizer/optimizer.py`` ``Float16OptimizerWithFloat16Params.__init__`` (``param.type() in
  ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']`` / ``== 'torch.cuda.FloatTensor'``),
  ``optimizer/distrib_optimizer.py`` ``_build_model_and_main_param_groups`` and ``__init__``
  (the same tests), and ``optimizer/clip_grads.py`` ``clip_grad_by_total_norm_fp32``
  (``assert param.grad.type() == 'torch.cuda.FloatTensor'``). ``Tensor.type(dtype)`` (a
  conversion) is untouched.
- ``device='cuda'`` keywords (already rewritten by ``megatron_on_cpu``'s function mode) cover
  ``optimizer/optimizer.py`` ``MixedPrecisionOptimizer.__init__`` (``found_inf``,
  ``_dummy_overflow_buf``, ``_scale_one``), ``FP32Optimizer.__init__`` (``_scale``) and
  ``optimizer/clip_grads.py`` (``total_norm_cuda``, ``dummy_overflow_buf``): no new line.

Without Transformer Engine or apex, megatron's optimizer falls back to ``torch.optim.AdamW``
(``optimizer/__init__.py``) and its norm and scaling to ``megatron.core.utils``'
``local_multi_tensor_l2_norm`` / ``local_multi_tensor_scale``: plain torch, which runs as
shipped. The DDP's reduction (``start_grad_sync``: ``all_reduce`` of the flat buffer, or
``reduce_scatter_tensor`` with the distributed optimizer) and the distributed optimizer's
``all_gather_into_tensor`` of the updated parameters go through gloo for real. ``parallel_state``
needs the gloo data-parallel groups (``compat.initialize_model_parallel(..., gloo_groups=True)``):
``get_megatron_optimizer`` asks for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from .cpu_megatron import megatron_on_cpu

#: CPU tensor type names and the CUDA names megatron's optimizers test for.
_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
}


class _CudaTypeNames(TorchFunctionMode):
    """``tensor.type()`` (no argument) answers the CUDA type name (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _CUDA_TYPE_NAMES.get(result, result)
        return result


@contextmanager
def megatron_optimizer_on_cpu() -> Iterator[None]:
    """``megatron_on_cpu`` plus the module docstring's redirection, for the ``with`` block."""
    with megatron_on_cpu(), _CudaTypeNames():
        yield
