"""Loading the updated policy into the sleeping rollout engine, in an order that fits one GPU shared
with vLLM (docs/training.md, "The loop", step 7; docs/cluster.md).
"""

from __future__ import annotations

import gc

import torch

from opefo_nemo.engines.protocols import Policy
from opefo_nemo.orchestration.protocols import RolloutEngine

WEIGHTS = ("weights",)
KV_CACHE = ("kv_cache",)


def release_cached_memory() -> None:  # pragma: no cover
    """Hand the CUDA caching allocator's unused blocks back to the device (no-op without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def refit_rollout(rollout: RolloutEngine, policy: Policy) -> None:
    """Wake and refit the sleeping rollout engine; every rank calls it (the weight walk is
    collective). Waking weights and KV cache together would ask the device for both while the
    trainer's caching allocator still holds the blocks the update used, hence this order. On the
    CPU the memory steps do nothing and CPU servers ignore sleep and wake."""
    release_cached_memory()  # the activations, logits, gradient buffers the update freed
    rollout.wake(WEIGHTS)  # weights only, not the KV cache yet
    rollout.update_weights(policy.named_weights())
    rollout.wake(KV_CACHE)
    release_cached_memory()  # the blocks the refit's gathers cached
