"""Pure-torch OPEFO core: ΔH, λ*, advantages, objectives, metrics (spec §2–§6).

Nothing in this package communicates; see :mod:`opefo_nemo.core.reduction` for the contract with
the layer that does.
"""

from opefo_nemo.core import advantages, entropy_flow, metrics, objectives, reduction
from opefo_nemo.core.advantages import group_advantages
from opefo_nemo.core.reduction import BatchReducer, SingleProcessReducer, Threshold

__all__ = [
    "BatchReducer",
    "SingleProcessReducer",
    "Threshold",
    "advantages",
    "entropy_flow",
    "group_advantages",
    "metrics",
    "objectives",
    "reduction",
]
