"""Loading the updated policy into the sleeping rollout engine, in an order that fits one GPU.

The vLLM servers share the training GPUs (docs/cluster.md). While the policy trains they sleep
(weights offloaded, KV cache dropped); waking weights and KV cache together before the refit
would ask the device for both while the trainer's caching allocator still holds the blocks the
update used. The order here:

1. return the trainer's cached, now unused blocks (activations, logits, gradient buffers the
   update freed) to the device;
2. wake vLLM's weights only;
3. refit them from the policy's weight stream;
4. wake the KV cache;
5. return the blocks the refit's gathers cached.

On the CPU (no CUDA) the memory steps do nothing and CPU servers ignore sleep and wake.
"""

from __future__ import annotations

import gc

import torch

from ..engines.protocols import Policy
from .protocols import RolloutEngine

WEIGHTS = ("weights",)
KV_CACHE = ("kv_cache",)


def release_cached_memory() -> None:  # pragma: no cover
    """Hand the CUDA caching allocator's unused blocks back to the device (no-op without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def refit_rollout(rollout: RolloutEngine, policy: Policy) -> None:
    """Steps 1–5 of the module docstring; every rank calls it (the weight walk is collective)."""
    release_cached_memory()
    rollout.wake(WEIGHTS)
    rollout.update_weights(policy.named_weights())
    rollout.wake(KV_CACHE)
    release_cached_memory()
