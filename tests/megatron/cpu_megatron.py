"""Run megatron-core's GPTModel forward and its schedules (no pipelining, and the
non-interleaved 1F1B pipeline) on CPU (gloo), on 0.16.1 and on 0.11.

megatron-core asks for CUDA in a few places that have nothing to do with the math: buffers it
allocates with an explicit CUDA device, and the dropout RNG tracker. On this CPU-only torch they
raise "Torch not compiled with CUDA enabled". :func:`megatron_on_cpu` points exactly these at the
CPU, in a spawned test rank only:

- ``pipeline_parallel/schedules.py`` ``forward_backward_no_pipelining``:
  ``total_num_tokens = torch.zeros([], dtype=torch.int, device="cuda")`` (the only CUDA use of
  the schedule itself with ``finalize_model_grads_func=None``);
- ``transformer/utils.py`` ``get_default_causal_mask``: ``torch.ones(sq, sq, device="cuda")``;
- ``utils.py`` ``GlobalMemoryBuffer.get_tensor`` (core attention's matmul buffer):
  ``device=torch.cuda.current_device()``;
- ``tensor_parallel/random.py``: the RNG tracker's ``fork()`` saves and restores the CUDA RNG
  state around dropout (dropout is 0 in these tests, so the state is never used);
- ``pipeline_parallel/schedules.py`` ``forward_backward_pipelining_without_interleaving``: the
  same ``total_num_tokens`` allocation as above (``device="cuda"``; 0.11 writes it
  ``torch.tensor(0, dtype=torch.int).cuda()``);
- ``pipeline_parallel/p2p_communication.py`` ``P2PCommunicator._communicate`` (0.11: the
  module function ``_communicate``): the receive buffers ``torch.empty(shape,
  requires_grad=True, device=torch.cuda.current_device())``, and ``torch.cuda.synchronize()``
  after ``batch_isend_irecv`` (``batch_p2p_comm`` and ``batch_p2p_sync``, both on by default;
  gloo's sends and receives are complete once waited on, so it becomes a no-op).

A ``TorchFunctionMode`` rewrites ``device="cuda…"`` arguments of torch calls to ``"cpu"`` and
makes ``Tensor.cuda()`` return the tensor itself;
``torch.cuda.current_device`` returns ``"cpu"``; ``torch.cuda.synchronize`` does nothing; the
tracker keeps CPU RNG states. Nothing else changes: the model, the schedules' loops, the p2p
sends and receives (``torch.distributed.batch_isend_irecv`` over gloo), ``forward_step``,
``forward_step_calc_loss`` (the loss scaling) and ``backward_step`` run as shipped. Sequence
parallelism and megatron's ``DistributedDataParallel`` stay off: both allocate CUDA buffers and
streams throughout (``tensor_parallel/mappings.py``, ``distributed/param_and_grad_buffer.py``),
and the local layer spec's torch norm refuses sequence parallelism.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode


class _CudaDeviceToCpu(TorchFunctionMode):
    """Every torch call's ``device="cuda…"`` keyword becomes ``"cpu"``; ``Tensor.cuda()`` keeps
    the tensor where it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cuda:
            return args[0]
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """The module docstring's redirections, for the ``with`` block (call after
    ``parallel_state.initialize_model_parallel``)."""
    from megatron.core.tensor_parallel import random

    saved = (
        torch.cuda.current_device,
        torch.cuda.synchronize,
        random._get_cuda_rng_state,
        random._set_cuda_rng_state,
    )
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    tracker = random.get_cuda_rng_tracker()
    tracker.states_[random._MODEL_PARALLEL_RNG_TRACKER_NAME] = torch.get_rng_state()
    try:
        with _CudaDeviceToCpu():
            yield
    finally:
        tracker.reset()
        (
            torch.cuda.current_device,
            torch.cuda.synchronize,
            random._get_cuda_rng_state,
            random._set_cuda_rng_state,
        ) = saved
