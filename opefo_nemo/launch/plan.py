"""Everything preflight checks about one launch, gathered from the config and the allocation."""

from __future__ import annotations

from dataclasses import dataclass, field

from .memory import MemorySettings
from .model_shape import ModelShape


@dataclass(frozen=True)
class LaunchPlan:
    """One training launch as preflight sees it.

    ``world_size`` comes from the allocation (Slurm's task count, or the config's
    ``cluster.nodes × cluster.gpus_per_node``); ``shape`` is ``None`` when the model's
    ``config.json`` could not be read (a path problem that preflight reports by itself).
    ``gpu_memory_bytes`` is 0 for CPU runs: then no memory-capacity check applies.
    """

    world_size: int
    tensor_parallel: int
    pipeline_parallel: int
    micro_batch_size: int
    prompts_per_step: int
    responses_per_prompt: int
    updates_per_rollout: int
    memory: MemorySettings
    engine: str
    sequence_parallel: bool = False
    shape: ModelShape | None = None
    gpu_memory_bytes: int = 0
    model_path: str | None = None
    data_paths: tuple[str, ...] = field(default_factory=tuple)
    checkpoint_dir: str | None = None
    resume_path: str | None = None

    @property
    def responses_per_step(self) -> int:
        """Responses one rollout step produces: prompts × responses per prompt."""
        return self.prompts_per_step * self.responses_per_prompt
