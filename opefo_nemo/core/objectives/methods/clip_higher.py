"""``clip_higher`` (spec §5): GRPO's clipped surrogate with a relaxed upper clip bound, so that
entropy-increasing updates are clipped less."""

from __future__ import annotations

from dataclasses import dataclass

from opefo_nemo.core.objectives.methods.clipped_surrogate import ClippedConfig, ClippedSurrogate
from opefo_nemo.core.objectives.registry import register_objective


@dataclass(frozen=True)
class ClipHigherConfig(ClippedConfig):
    clip_eps_high: float = 0.28
    """Relaxed: keeps entropy-increasing updates (paper Fig. 2c)."""


@register_objective("clip_higher")
class ClipHigher(ClippedSurrogate):
    """Clip-higher (DAPO): GRPO's clipped surrogate with a relaxed upper clip bound (paper:
    ε_low 0.2, ε_high 0.28)."""

    config_type = ClipHigherConfig
