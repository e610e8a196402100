"""The objective family of spec §5 and the two-phase contract of docs/architecture.md.

Phase 1 (engine): per-token statistics → :class:`TokenChunk` per micro-batch.
Phase 2: :func:`prepare` (all chunks + a reducer) → :class:`Coefficients` per chunk.
Phase 3 (engine, per micro-batch): :func:`policy_loss` → loss share and metric sums.
"""

from .config import ClipCovConfig, EntropyFlowConfig, KLCovConfig, MethodConfig
from .loss import LOSS_SUMS, LossOutput, policy_loss
from .prepare import Prepared, prepare
from .registry import Objective, get_objective, register_objective, registered_objectives
from .tokens import Coefficients, LossInputs, TokenChunk

__all__ = [
    "LOSS_SUMS",
    "ClipCovConfig",
    "Coefficients",
    "EntropyFlowConfig",
    "KLCovConfig",
    "LossInputs",
    "LossOutput",
    "MethodConfig",
    "Objective",
    "Prepared",
    "TokenChunk",
    "get_objective",
    "policy_loss",
    "prepare",
    "register_objective",
    "registered_objectives",
]
