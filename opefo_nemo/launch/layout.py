"""The tensor × pipeline × data-parallel layout of a training job."""

from __future__ import annotations

from dataclasses import dataclass

from opefo_nemo.models.shape import check_positive_ints


@dataclass(frozen=True)
class ParallelLayout:
    """``world_size = tensor · pipeline · data``; ``sequence_parallel`` splits the non-TP
    activations (norm inputs) across the tensor-parallel group as Megatron does."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        check_positive_ints(self, ("tensor", "pipeline", "data"))

    @property
    def world_size(self) -> int:
        """Ranks the layout needs."""
        return self.tensor * self.pipeline * self.data

    @classmethod
    def for_world(
        cls, world_size: int, tensor: int, pipeline: int, sequence_parallel: bool = False
    ) -> ParallelLayout:
        """The layout whose data-parallel size fills ``world_size`` (Megatron derives DP so).

        Raises ``ValueError`` when ``tensor · pipeline`` does not divide ``world_size``.
        """
        if world_size <= 0 or tensor <= 0 or pipeline <= 0:
            raise ValueError(
                f"world size {world_size}, tensor parallel {tensor} and pipeline parallel "
                f"{pipeline} must all be positive"
            )
        if world_size % (tensor * pipeline):
            raise ValueError(
                f"world size {world_size} is not a multiple of tensor parallel {tensor} × "
                f"pipeline parallel {pipeline} = {tensor * pipeline}"
            )
        return cls(tensor, pipeline, world_size // (tensor * pipeline), sequence_parallel)
