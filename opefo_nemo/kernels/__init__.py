"""Triton kernels for the per-token statistics of a vocabulary shard (spec §1), docs/kernels.md.

- ``logits_stats``: forward partial sums and backward of one shard of logits ``[tokens, V/TP]``.
- ``linear_stats``: the same straight from hidden states ``[tokens, h]`` and the output weight
  shard ``[V/TP, h]``, tile by tile, without the logits in memory (gradients to both).
- ``partials``: the shard's sums and their shift to the global row max (plain torch).
- ``select``: ``engine.stats_kernel`` (``auto``/``torch``/``triton``, and ``fused_linear`` for the
  megatron-core engines) resolved for a device.

The Triton modules import ``triton`` at import; this package and ``partials``/``select`` do not,
so callers import them only once a Triton kernel is chosen. Communication is the caller's
(``opefo_nemo.parallel``): these kernels see one shard.
"""

from opefo_nemo.kernels.select import (
    ENGINE_STATS_KERNELS,
    FUSED_LINEAR,
    STATS_KERNELS,
    resolve_stats_kernel,
    triton_importable,
    triton_interpreted,
)

__all__ = [
    "ENGINE_STATS_KERNELS",
    "FUSED_LINEAR",
    "STATS_KERNELS",
    "resolve_stats_kernel",
    "triton_importable",
    "triton_interpreted",
]
