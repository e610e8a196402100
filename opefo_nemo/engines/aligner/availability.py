"""Whether the NeMo-Aligner actor can be built here, and the error when it cannot.

The actor class (NeMo's ``MegatronGPTModel`` behind NeMo-Aligner's actor interface) is not written
yet (issue 8); what exists is NeMo-free: the weight mapping, the data-parallel sharding and the
loss closure for megatron-core's schedule. Until the actor exists, constructing the ``aligner``
engine fails with :class:`AlignerUnavailableError` saying so, after the config and preflight
have accepted the run.
"""

from __future__ import annotations

import importlib.util
from typing import NoReturn

#: Modules the actor will import (NeMo, NeMo-Aligner; megatron-core comes with NeMo).
ACTOR_MODULES = ("nemo", "nemo_aligner", "megatron.core")


class AlignerUnavailableError(RuntimeError):
    """``engine.name=aligner`` asked for an actor this environment cannot build."""


def missing_modules() -> list[str]:
    """Which of :data:`ACTOR_MODULES` cannot be found (without importing them)."""
    missing = []
    for name in ACTOR_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def build_actor(*_: object, **__: object) -> NoReturn:
    """Construct the ``aligner`` engine's policy: raises :class:`AlignerUnavailableError` naming
    what is missing here, since the NeMo actor class is not built yet (issue 8)."""
    missing = missing_modules()
    here = (
        f"this environment lacks {', '.join(missing)} (the actor runs in the NeMo container); "
        if missing
        else ""
    )
    raise AlignerUnavailableError(
        "engine.name=aligner: the NeMo-Aligner engine is not available here: "
        f"{here}its NeMo actor class is not built yet (issue 8). Built so far, NeMo-free: the "
        "Megatron <-> Hugging Face weight mapping, data-parallel sharding and the loss closure "
        "for megatron-core's schedule (docs/aligner.md). Train with engine=hf meanwhile."
    )
