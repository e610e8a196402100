"""Which implementation computes the per-token statistics: ``engine.stats_kernel``
(docs/kernels.md, "Choosing the kernel").
"""

from __future__ import annotations

import functools
import importlib.util
import os

STATS_KERNELS = ("auto", "torch", "triton")
"""The values of ``token_stats(kernel=...)`` (and of ``engine.stats_kernel`` for every engine):
``torch``, the chunked plain-torch path (``parallel/vocab_stats.py``), any device; ``triton``, the
Triton kernels over the logits shard, on CUDA tensors or CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, what the CPU tests use); ``auto``, ``triton`` for CUDA tensors when
Triton imports, else ``torch``."""
FUSED_LINEAR = "fused_linear"
"""The ``engine.stats_kernel`` of the megatron-core engines (``megatron`` / ``aligner`` only) that
fuses the output layer: the statistics from the final hidden states and the output weight
(``parallel/linear_stats.py``), the logits never stored; the same devices as ``triton``."""
ENGINE_STATS_KERNELS = (*STATS_KERNELS, FUSED_LINEAR)
"""Every value of ``engine.stats_kernel``."""


@functools.cache
def triton_importable() -> bool:
    """Whether ``import triton`` can succeed here (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (on CPU tensors): ``TRITON_INTERPRET=1``."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_stats_kernel(choice: str, on_cuda: bool) -> str:
    """``torch`` or ``triton`` for ``choice`` (one of :data:`STATS_KERNELS`) on a tensor that is
    ``on_cuda`` or not. Raises ``ValueError`` for an unknown choice, for ``triton`` without
    Triton, and for ``triton`` on CPU tensors outside the interpreter."""
    if choice not in STATS_KERNELS:
        raise ValueError(f"stats kernel {choice!r} is not one of {', '.join(STATS_KERNELS)}")
    if choice == "auto":
        return "triton" if on_cuda and triton_importable() else "torch"
    if choice == "triton":
        if not triton_importable():
            raise ValueError(
                "stats kernel 'triton' needs the triton package, which is not installed"
            )
        if not on_cuda and not triton_interpreted():
            raise ValueError(
                "stats kernel 'triton' needs CUDA tensors "
                "(CPU tensors only under TRITON_INTERPRET=1)"
            )
    return choice
