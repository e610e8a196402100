"""Micro-batches for megatron-core's pipelined schedule and the token-stats hand-off (PP ≥ 1):
every micro-batch padded to the schedule's fixed ``[micro_batch_size, seq_length]``, each stage fed
only the keys it reads, the last stage's statistics broadcast to every stage (docs/megatron.md,
"Pipeline parallelism").
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
"""What the first stage's model reads: int64 ``[mbs, T]`` each."""
STATS_KEYS = ("targets",)
"""What the last stage's token-stats function reads: int64 ``[mbs, T]``."""
STATS_NAMES = ("logprob", "entropy")


@dataclass(frozen=True)
class PipelineMicroBatches:
    """A data-parallel shard cut into ``micros`` (``TrainBatch.split``, each trimmed to its own
    rows and width), every one fed to the schedule padded to ``[micro_batch_size, seq_length]``:
    stages exchange activations of that one shape (``get_tensor_shapes``;
    ``config.variable_seq_lengths`` off). Padding is right-padded columns (causal attention:
    earlier positions never see them) and, when the rows are not a multiple of the micro-batch
    size, all-masked rows in the last micro-batch; it is masked out of the loss and dropped from
    the statistics. Build with :meth:`split`."""

    micros: tuple[TrainBatch, ...]
    micro_batch_size: int
    seq_length: int

    @classmethod
    def split(
        cls, shard: TrainBatch, micro_batch_size: int, seq_multiple: int = 1
    ) -> PipelineMicroBatches:
        """``shard`` in micro-batches of ``micro_batch_size`` rows; ``seq_length`` = the shard's
        width rounded up to ``seq_multiple`` (the TP size with sequence parallelism, which
        splits the sequence over TP ranks)."""
        if seq_multiple < 1:
            raise ValueError(f"seq_multiple must be >= 1, got {seq_multiple}")
        width = int(shard.input_ids.shape[1])
        seq_length = -(-width // seq_multiple) * seq_multiple
        return cls(tuple(shard.split(micro_batch_size)), micro_batch_size, seq_length)

    def __post_init__(self) -> None:
        if not self.micros:
            raise ValueError("PipelineMicroBatches needs at least one micro-batch")
        for i, micro in enumerate(self.micros):
            rows, width = micro.input_ids.shape
            if rows > self.micro_batch_size or width > self.seq_length:
                raise ValueError(
                    f"micro-batch {i} is [{rows}, {width}], larger than the schedule's "
                    f"[{self.micro_batch_size}, {self.seq_length}]"
                )

    @property
    def num_microbatches(self) -> int:
        return len(self.micros)

    @property
    def padded_rows(self) -> int:
        """Rows of the stacked statistics: ``num_microbatches × micro_batch_size``."""
        return self.num_microbatches * self.micro_batch_size

    def _fit(self, tensor: Tensor, fill: float | bool | int) -> Tensor:
        """``tensor`` ``[r, w]`` in the top-left corner of a ``[mbs, T]`` tensor of ``fill``."""
        out = torch.full(
            (self.micro_batch_size, self.seq_length), fill, dtype=tensor.dtype, device=tensor.device
        )
        out[: tensor.shape[0], : tensor.shape[1]] = tensor
        return out

    def _first_stage(self, micro: TrainBatch) -> dict[str, Tensor]:
        input_ids = self._fit(micro.input_ids, 0)
        positions = torch.arange(self.seq_length, device=input_ids.device)
        return {"input_ids": input_ids, "position_ids": positions.expand_as(input_ids)}

    def stats_items(self, first: bool, last: bool) -> list[dict[str, Tensor]]:
        """One dict per micro-batch for this stage (both passes), with only the keys it reads: the
        first stage ``input_ids``, ``position_ids``; the last stage ``targets``; a middle stage an
        empty dict. The loss pass needs nothing else: the trainer's loss closure holds the step's
        coefficients on the device."""
        items = []
        for micro in self.micros:
            item = self._first_stage(micro) if first else {}
            if last:
                item["targets"] = self._fit(micro.targets, 0)
            items.append(item)
        return items

    def gather_stats(
        self,
        outputs: Sequence[Mapping[str, Tensor]],
        pp_group: dist.ProcessGroup | None,
        device: torch.device | str = "cpu",
        sums: Sequence[str] = (),
    ) -> dict[str, Tensor]:
        """The token-stats pass's per-token statistics on every stage of ``pp_group``.

        ``outputs``: what the schedule returned (on the last stage one ``stats_function`` dict
        per micro-batch; ignored elsewhere). Returns ``logprob``, ``entropy`` and the vocabulary
        ``sums`` the stats function was asked for, each fp32 ``[padded_rows, seq_length]``, equal
        on every stage: one ``broadcast_from_last_stage`` over the pipeline group. ``device``:
        where the other stages receive them.
        """
        names = STATS_NAMES + tuple(sums)
        shape = (self.padded_rows, self.seq_length)
        if is_last_stage(pp_group):
            if len(outputs) != self.num_microbatches:
                raise ValueError(
                    f"the last stage got {len(outputs)} stats outputs for "
                    f"{self.num_microbatches} micro-batches"
                )
            stacked = {name: torch.cat([out[name] for out in outputs]) for name in names}
            for name, value in stacked.items():
                if tuple(value.shape) != shape:
                    raise ValueError(f"stacked {name} is {tuple(value.shape)}, expected {shape}")
        else:
            stacked = {
                name: torch.empty(shape, dtype=torch.float32, device=device) for name in names
            }
        return broadcast_from_last_stage(stacked, pp_group)

    def unpad(self, tensor: Tensor) -> list[Tensor]:
        """A stacked per-token tensor ``[padded_rows, seq_length]`` back to one ``[r_i, T_i − 1]``
        tensor per micro-batch (the ``TrainBatch`` per-token layout), padding dropped."""
        if tuple(tensor.shape) != (self.padded_rows, self.seq_length):
            raise ValueError(
                f"unpad expects [{self.padded_rows}, {self.seq_length}], got {tuple(tensor.shape)}"
            )
        out = []
        for i, micro in enumerate(self.micros):
            rows, width = micro.targets.shape
            start = i * self.micro_batch_size
            out.append(tensor[start : start + rows, :width])
        return out

    def stack_rows(self, stats: Mapping[str, Tensor], names: Sequence[str], width: int) -> Tensor:
        """The statistics ``names`` of :meth:`gather_stats` as one fp32 ``[len(names), rows,
        width]`` tensor: the micro-batches' rows in order, padding dropped (:meth:`unpad`), 0
        past each micro-batch's own width."""
        rows = sum(int(micro.targets.shape[0]) for micro in self.micros)
        device = stats[names[0]].device
        out = torch.zeros((len(names), rows, width), dtype=torch.float32, device=device)
        for field, name in enumerate(names):
            start = 0
            for block in self.unpad(stats[name]):
                out[field, start : start + block.shape[0], : block.shape[1]] = block
                start += block.shape[0]
        return out


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
