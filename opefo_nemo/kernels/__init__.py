"""Triton kernels for the per-token statistics of a vocabulary shard (spec §1; docs/kernels.md):
``logits_stats`` over logits, ``linear_stats`` straight from hidden states and the output weight,
``partials`` and ``select`` in plain torch. The Triton modules import ``triton`` at import; this
package, ``partials`` and ``select`` do not. Communication is the caller's (``parallel/``).
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
