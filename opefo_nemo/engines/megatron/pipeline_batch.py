"""Micro-batches for megatron-core's schedules and the token-stats hand-off (PP ≥ 1): every
micro-batch fed at its own shape (its rows, its longest row rounded up to the sequence multiple),
each stage fed only the keys it reads, the last stage's statistics broadcast to every stage
(docs/megatron.md, "Pipeline parallelism").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.engines.batch import TrainBatch, to_device
from opefo_nemo.engines.megatron import fused_output
from opefo_nemo.engines.megatron.loss_closure import LossFunction
from opefo_nemo.parallel.pipeline import broadcast_from_last_stage, is_last_stage

FIRST_STAGE_KEYS = ("input_ids", "position_ids")
"""What the first stage's model reads: int64 ``[rows, T]`` each."""
STATS_KEYS = ("targets",)
"""What the last stage's token-stats function reads: int64 ``[rows, T]``."""


def _round_up(width: int, multiple: int) -> int:
    """``width`` rounded up to a multiple of ``multiple``."""
    return -(-width // multiple) * multiple


@dataclass(frozen=True)
class PipelineMicroBatches:
    """One rank's micro-batches of one pass (each a ``TrainBatch`` trimmed to its own rows and
    longest row, ``TrainBatch.select``), every one fed to the schedule at its own shape
    ``[rows_i, T_i]``: ``T_i`` its width rounded up to ``seq_multiple`` (the TP size under
    sequence parallelism, which splits the sequence over the TP ranks). At PP 1 the schedule
    takes any shapes; at PP > 1 stages exchange activations ``[T_i, rows_i, h]`` and, when the
    shapes differ, their sizes first (``config.variable_seq_lengths``, set by
    :func:`~.schedule_driver.run_schedule` from :attr:`variable_shapes`). Padding is right-padded
    columns (causal attention: earlier positions never see them); it is masked out of the loss
    and dropped from the statistics."""

    micros: tuple[TrainBatch, ...]
    seq_multiple: int = 1

    def __post_init__(self) -> None:
        if not self.micros:
            raise ValueError("PipelineMicroBatches needs at least one micro-batch")
        if self.seq_multiple < 1:
            raise ValueError(f"seq_multiple must be >= 1, got {self.seq_multiple}")

    @property
    def num_microbatches(self) -> int:
        return len(self.micros)

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """``(rows, padded width)`` of each micro-batch as the schedule runs it."""
        return tuple(
            (micro.rows, _round_up(int(micro.input_ids.shape[1]), self.seq_multiple))
            for micro in self.micros
        )

    @property
    def variable_shapes(self) -> bool:
        """Whether the micro-batches' shapes differ (stages then exchange each one's shape)."""
        return len(set(self.shapes)) > 1

    @property
    def rows(self) -> int:
        """Rows of all micro-batches together."""
        return sum(micro.rows for micro in self.micros)

    def stats_items(self, first: bool, last: bool) -> list[dict[str, Tensor]]:
        """One dict per micro-batch for this stage (both passes), with only the keys it reads: the
        first stage ``input_ids``, ``position_ids``; the last stage ``targets``; a middle stage an
        empty dict; each ``[rows_i, T_i]``, right-padded with 0. The loss pass needs nothing
        else: the trainer's loss closure holds the step's coefficients on the device."""
        items = []
        for micro, (_, width) in zip(self.micros, self.shapes, strict=True):
            item: dict[str, Tensor] = {}
            if first:
                input_ids = _pad_columns(micro.input_ids, width)
                positions = torch.arange(width, device=input_ids.device)
                item = {"input_ids": input_ids, "position_ids": positions.expand_as(input_ids)}
            if last:
                item["targets"] = _pad_columns(micro.targets, width)
            items.append(item)
        return items

    def gather_stats(
        self,
        outputs: Sequence[Mapping[str, Tensor]],
        names: Sequence[str],
        width: int,
        pp_group: dist.ProcessGroup | None,
        device: torch.device | str = "cpu",
    ) -> Tensor:
        """The token-stats pass's statistics ``names`` as one fp32 ``[len(names), rows, width]``
        tensor, equal on every stage of ``pp_group``: the micro-batches' rows in order, each
        micro-batch's ``[rows_i, T_i − 1]`` predicted columns (padding dropped), 0 past them.

        ``outputs``: what the schedule returned (on the last stage one ``stats_function`` dict
        per micro-batch, each ``[rows_i, T_i]`` padded; ignored elsewhere). One broadcast over
        the pipeline from the last stage (``broadcast_from_last_stage``); ``device``: where the
        other stages receive it."""
        out = torch.zeros((len(names), self.rows, width), dtype=torch.float32, device=device)
        if is_last_stage(pp_group):
            if len(outputs) != self.num_microbatches:
                raise ValueError(
                    f"the last stage got {len(outputs)} stats outputs for "
                    f"{self.num_microbatches} micro-batches"
                )
            start = 0
            for micro, output in zip(self.micros, outputs, strict=True):
                rows, columns = micro.targets.shape
                for field, name in enumerate(names):
                    out[field, start : start + rows, :columns] = output[name][:rows, :columns]
                start += rows
        return broadcast_from_last_stage({"stats": out}, pp_group)["stats"]


def _pad_columns(tensor: Tensor, width: int) -> Tensor:
    """``tensor`` ``[r, w]`` right-padded with 0 to ``[r, width]``."""
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))


ForwardStep = Callable[[object, torch.nn.Module], tuple[Tensor, LossFunction | None]]
"""megatron's ``forward_step_func(data_iterator, model) -> (output, fn)``."""


def forward_step_func(
    make_fn: Callable[[Mapping[str, Tensor]], LossFunction],
    last: bool,
    stop_before_output_layer: bool = False,
) -> ForwardStep:
    """megatron's ``forward_step_func`` over this module's item iterators, for every stage.

    Takes the next item (every stage, every micro-batch), moves it to the model's device
    (:func:`~opefo_nemo.engines.batch.to_device`: pinned, non-blocking on a GPU) and runs
    ``model(input_ids, position_ids, None)`` (``None`` inputs on later stages: ``GPTModel`` then
    reads the previous stage's activations); causal attention, no mask. On the ``last`` stage the
    function is ``make_fn(item)`` (e.g. ``stats_function`` of ``item["targets"]``, or
    the policy's loss pass); elsewhere ``None`` (the schedule never calls it there). With
    ``stop_before_output_layer`` the last stage's model returns its final hidden states instead
    of the logits (:func:`~.fused_output.stop_before_output_layer`).
    """

    def forward_step(data_iterator, model: torch.nn.Module):
        device = next(model.parameters()).device
        item = {key: to_device(value, device) for key, value in next(data_iterator).items()}
        fused = last and stop_before_output_layer
        with fused_output.stop_before_output_layer(model) if fused else nullcontext():
            output = model(item.get("input_ids"), item.get("position_ids"), None)
        return output, make_fn(item) if last else None

    return forward_step
