"""The objective family of spec §5 and the two-phase contract of docs/architecture.md: a method is
an :class:`Objective` plug-in registered by name (built-in ones in :mod:`.methods`); phase 1 gives
a :class:`TokenChunk` per micro-batch, :func:`prepare` the :class:`Coefficients`, and
:func:`policy_loss` each micro-batch's loss share.
"""

from opefo_nemo.core.objectives.base import (
    BatchStatistics,
    EntropyFlowConfig,
    MethodConfig,
    Objective,
)
from opefo_nemo.core.objectives.loss import (
    LossOutput,
    loss_sum_names,
    policy_loss,
    step_loss_metrics,
)
from opefo_nemo.core.objectives.prepare import COMMON_SUMS, Prepared, prepare
from opefo_nemo.core.objectives.registry import (
    build_objective,
    method_config,
    objective_class,
    register_objective,
    registered_objectives,
)
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs, TokenChunk

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
