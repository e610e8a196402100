"""Everything preflight checks about one launch, gathered from the config and the allocation."""

from __future__ import annotations

from dataclasses import dataclass, field

from opefo_nemo.launch.memory import MemorySettings
from opefo_nemo.models.shape import ModelShape


@dataclass(frozen=True)
class LaunchPlan:
    """One training launch as preflight sees it.

    ``world_size`` and ``gpus_per_node`` come from the allocation (Slurm's task counts;
    ``gpus_per_node`` 0: one node holds every rank); ``shape`` is ``None`` when the model's
    ``config.json`` could not be read (a path problem that preflight reports by itself).
    ``gpu_memory_bytes`` is 0 for CPU runs: then no memory-capacity check applies.
    ``rollout_tp_size`` is the tensor-parallel size of each colocated vLLM server
    (``engine.rollout_tp_size``; multi-process engines only).
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
    gpus_per_node: int = 0
    rollout_tp_size: int = 1

    @property
    def ranks_per_node(self) -> int:
        """GPUs (ranks) per node: ``gpus_per_node``, or the whole world on one node."""
        return self.gpus_per_node or self.world_size

    @property
    def responses_per_step(self) -> int:
        """Responses one rollout step produces: prompts × responses per prompt."""
        return self.prompts_per_step * self.responses_per_prompt
