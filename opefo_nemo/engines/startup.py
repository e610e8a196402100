"""What the trainer refuses at start-up beyond the configuration's own validation: the rules that
depend on the installed megatron-core and on the model. ``opefo-train`` (``trainer.setup``) raises
them, ``opefo-preflight`` reports them: one function, so preflight cannot say OK to a run the
trainer refuses. megatron-core is consulted without being required (a login node may lack it).
"""

from __future__ import annotations

import importlib.util

from opefo_nemo.config.engines import EngineConfig, MegatronEngineConfig
from opefo_nemo.engines.megatron import compat
from opefo_nemo.models.shape import ModelShape


class DeviceUnavailableError(RuntimeError):
    """The configured device is not there (``engine.device=cuda`` on a rank without a GPU): a
    start-up problem of the set-up, reported in one line like the others."""


def _megatron_importable() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False


def startup_problems(
    engine: EngineConfig | MegatronEngineConfig, shape: ModelShape | None
) -> list[str]:
    """One line per reason the trainer would refuse ``engine`` on the model of ``shape``
    (``None``: the model is not readable yet; its own checks come later). Empty for ``hf``.

    - TP above the model's key/value heads where the installed megatron-core (or, where none is
      importable, the NeMo image's 0.11) cannot build it (:func:`compat.tensor_parallel_problem`);
    - CPU ranks with the distributed optimizer where megatron-core cannot checkpoint it
      (:func:`compat.distributed_optimizer_checkpoint_problem`).
    """
    if not isinstance(engine, MegatronEngineConfig):
        return []
    problems = []
    if shape is not None:
        problem = compat.tensor_parallel_problem(
            engine.tensor_model_parallel_size, shape.num_key_value_heads
        )
        if problem is not None:
            problems.append(problem)
    if engine.device == "cpu" and engine.use_distributed_optimizer and _megatron_importable():
        problem = compat.distributed_optimizer_checkpoint_problem()
        if problem is not None:
            problems.append(f"engine.use_distributed_optimizer with engine.device=cpu: {problem}")
    return problems
