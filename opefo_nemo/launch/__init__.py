"""Launch planning for clusters: layouts, per-GPU memory estimates, preflight and node checks.

The planning is pure Python and torch-free arithmetic: nothing here imports NeMo, megatron or
vLLM, so ``opefo-preflight`` runs on a login node before any GPU work. ``node.py``
(``opefo-node-check``) runs on the nodes themselves and probes the environments there.
"""

from ..models.shape import ModelShape
from .checks import Problem, all_problems, plan_memory
from .layout import ParallelLayout
from .memory import GIB, MemoryEstimate, MemorySettings, estimate_memory
from .plan import LaunchPlan

__all__ = [
    "GIB",
    "LaunchPlan",
    "MemoryEstimate",
    "MemorySettings",
    "ModelShape",
    "ParallelLayout",
    "Problem",
    "all_problems",
    "estimate_memory",
    "plan_memory",
]
