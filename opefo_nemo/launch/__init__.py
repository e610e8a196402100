"""Launch planning for clusters: layouts, per-GPU memory estimates, preflight and node checks.

The planning is pure Python and torch-free arithmetic: nothing here imports NeMo, megatron or
vLLM, so ``opefo-preflight`` runs on a login node before any GPU work. ``node.py``
(``opefo-node-check``) runs on the nodes themselves and probes the environments there.
"""

from opefo_nemo.launch.checks import LaunchProblem, all_problems, plan_memory
from opefo_nemo.launch.layout import ParallelLayout
from opefo_nemo.launch.memory import GIB, MemoryEstimate, MemorySettings, estimate_memory
from opefo_nemo.launch.plan import LaunchPlan
from opefo_nemo.models.shape import ModelShape

__all__ = [
    "GIB",
    "LaunchPlan",
    "LaunchProblem",
    "MemoryEstimate",
    "MemorySettings",
    "ModelShape",
    "ParallelLayout",
    "all_problems",
    "estimate_memory",
    "plan_memory",
]
