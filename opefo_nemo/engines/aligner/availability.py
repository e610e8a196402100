"""Whether the NeMo-Aligner actor can be built here, and building it: :func:`build_actor` checks for
NeMo, NeMo-Aligner and megatron-core without importing them and only then imports :mod:`.actor`,
so this package stays importable anywhere (docs/megatron.md, "The NeMo actor").
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opefo_nemo.config.engines import MegatronEngineConfig
    from opefo_nemo.engines.protocols import Policy

#: Modules the actor imports (NeMo, NeMo-Aligner; megatron-core comes with NeMo).
ACTOR_MODULES = ("nemo", "nemo_aligner", "megatron.core")


class AlignerUnavailableError(RuntimeError):
    """``engine.name=aligner`` asked for an actor this environment or configuration cannot
    build."""


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


def build_actor(
    model_dir: str | Path, engine: MegatronEngineConfig, *, lr: float, temperature: float
) -> Policy:
    """The ``aligner`` engine's ``Policy`` on the model at ``model_dir`` (its Hugging Face
    directory, holding the NeMo checkpoint too: docs/megatron.md, "The NeMo actor").

    Raises :class:`AlignerUnavailableError` naming the missing modules when NeMo, NeMo-Aligner or
    megatron-core is not installed here.
    """
    missing = missing_modules()
    if missing:
        raise AlignerUnavailableError(
            f"engine.name=aligner: this environment lacks {', '.join(missing)}; the NeMo actor "
            "runs in the NeMo container (docs/cluster.md). Train with engine=hf here."
        )
    from opefo_nemo.engines.aligner.actor import build_nemo_actor

    return build_nemo_actor(model_dir, engine, lr=lr, temperature=temperature)
