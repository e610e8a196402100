"""The objective family of spec §5 and the two-phase contract of docs/architecture.md.

A method is an :class:`Objective` plug-in (settings dataclass, batch sums, coefficients, per-token
loss, metrics; :mod:`.base`) registered by name; the built-in ones live in :mod:`.methods`.
Phase 1 (engine): per-token statistics → :class:`TokenChunk` per micro-batch.
Phase 2: :func:`prepare` (all chunks + a reducer) → :class:`Coefficients` per chunk.
Phase 3 (engine, per micro-batch): :func:`policy_loss` → loss share and metric sums.
"""

from .base import BatchStatistics, EntropyFlowConfig, MethodConfig, Objective
from .loss import LossOutput, loss_sum_names, policy_loss, step_loss_metrics
from .prepare import COMMON_SUMS, Prepared, prepare
from .registry import (
    build_objective,
    method_config,
    objective_class,
    register_objective,
    registered_objectives,
)
from .tokens import Coefficients, LossInputs, TokenChunk

__all__ = [
    "COMMON_SUMS",
    "BatchStatistics",
    "Coefficients",
    "EntropyFlowConfig",
    "LossInputs",
    "LossOutput",
    "MethodConfig",
    "Objective",
    "Prepared",
    "TokenChunk",
    "build_objective",
    "loss_sum_names",
    "method_config",
    "objective_class",
    "policy_loss",
    "prepare",
    "register_objective",
    "registered_objectives",
    "step_loss_metrics",
]
