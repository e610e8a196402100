"""Micro-batches for megatron-core's pipelined schedule and the token-stats hand-off (PP ≥ 1).

megatron-core 0.16.1's ``forward_backward_pipelining_without_interleaving``
(``pipeline_parallel/schedules.py``) calls ``forward_step_func(data_iterator, model)`` once per
micro-batch on *every* stage, in order; only the first stage's model reads tokens (the others get
their input from the previous stage through ``set_input_tensor``), and only the last stage calls
the returned loss function. Stages exchange activations of the fixed shape
``[seq_length, micro_batch_size, hidden]`` (``get_tensor_shapes``; ``config.variable_seq_lengths``
off, the default), so every micro-batch is padded to exactly ``[micro_batch_size, seq_length]``
here: right-padded columns (causal attention: earlier positions never see them) and, when the
shard's rows are not a multiple of the micro-batch size, all-masked rows in the last micro-batch.
Padding is masked out of the loss and dropped from the statistics.

Each stage's iterator yields one dict per micro-batch with only the keys that stage uses
(:func:`stage_keys`): the first stage ``input_ids``, ``position_ids``; the last stage ``targets``
and, in the loss pass, ``mask``, ``advantages``, the coefficients ``delta_h``, ``weight``,
``selected`` from the whole step's ``prepare`` (ARCHITECTURE.md phase 2), optionally
``old_logprob``, and ``n_tokens`` (the global token count, 0-d int64, SPEC §5); a middle stage an
empty dict. Per-token tensors cover all ``seq_length`` positions (``loss_closure.per_position``).

Token-stats pass (phase 1): the last stage's ``stats_function`` outputs, one ``[mbs, T]`` dict per
micro-batch, are stacked and broadcast over the pipeline group
(:meth:`PipelineMicroBatches.gather_stats`), so every stage can build the same
:class:`~opefo_nemo.core.objectives.TokenChunk` list and run the same ``prepare``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from ...core.objectives import Coefficients, MethodConfig, TokenChunk
from ...parallel.pipeline import broadcast_from_last_stage, is_last_stage
from ..batch import TrainBatch
from .loss_closure import (
    LossFunction,
    LossMicroBatch,
    MegatronScaling,
    VocabParallelLogits,
    loss_function,
)

FIRST_STAGE_KEYS = ("input_ids", "position_ids")
"""What the first stage's model reads: int64 ``[mbs, T]`` each."""
STATS_KEYS = ("targets",)
"""What the last stage's token-stats function reads: int64 ``[mbs, T]``."""
LOSS_KEYS = ("targets", "mask", "advantages", "delta_h", "weight", "selected", "n_tokens")
"""What the last stage's loss function reads (plus ``old_logprob`` when given)."""
STATS_NAMES = ("logprob", "entropy")
TABULAR_NAMES = ("sum_p2", "sum_p2_logp")


def stage_keys(first: bool, last: bool, loss: bool) -> tuple[str, ...]:
    """The keys one stage's micro-batch dicts carry (module docstring); ``loss``: the loss pass
    (``old_logprob`` comes on top when given)."""
    keys = FIRST_STAGE_KEYS if first else ()
    if last:
        keys += tuple(k for k in (LOSS_KEYS if loss else STATS_KEYS) if k not in keys)
    return keys


@dataclass(frozen=True)
class PipelineMicroBatches:
    """A data-parallel shard cut into ``micros`` (``TrainBatch.split``, each trimmed to its own
    rows and width), every one fed to the schedule padded to ``[micro_batch_size, seq_length]``.
    Build with :meth:`split`."""

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
        """One dict per micro-batch for this stage's token-stats pass."""
        items = []
        for micro in self.micros:
            item = self._first_stage(micro) if first else {}
            if last:
                item["targets"] = self._fit(micro.targets, 0)
            items.append(item)
        return items

    def loss_items(
        self,
        coefficients: Sequence[Coefficients],
        n_tokens: int,
        first: bool,
        last: bool,
        old_logprob: Sequence[Tensor] | None = None,
    ) -> list[dict[str, Tensor]]:
        """One dict per micro-batch for this stage's loss pass. ``coefficients``: ``prepare``'s,
        one per micro-batch (``[r_i, T_i − 1]``, the :meth:`token_chunks` order); ``n_tokens``:
        its global count; ``old_logprob``: per micro-batch, as :meth:`unpad` returns it."""
        if len(coefficients) != self.num_microbatches:
            raise ValueError(
                f"{len(coefficients)} coefficient chunks for {self.num_microbatches} micro-batches"
            )
        if old_logprob is not None and len(old_logprob) != self.num_microbatches:
            raise ValueError(
                f"{len(old_logprob)} old_logprob chunks for {self.num_microbatches} micro-batches"
            )
        items = []
        for i, (micro, coeff) in enumerate(zip(self.micros, coefficients, strict=True)):
            item = self._first_stage(micro) if first else {}
            if last:
                item.update(
                    targets=self._fit(micro.targets, 0),
                    mask=self._fit(micro.response_mask, False),
                    advantages=self._fit(micro.advantages, 0.0),
                    delta_h=self._fit(coeff.delta_h, 0.0),
                    weight=self._fit(coeff.weight, 1.0),
                    selected=self._fit(coeff.selected, False),
                    n_tokens=torch.tensor(n_tokens, dtype=torch.int64),
                )
                if old_logprob is not None:
                    item["old_logprob"] = self._fit(old_logprob[i], 0.0)
            items.append(item)
        return items

    def gather_stats(
        self,
        outputs: Sequence[Mapping[str, Tensor]],
        pp_group: dist.ProcessGroup | None,
        device: torch.device | str = "cpu",
        tabular: bool = False,
    ) -> dict[str, Tensor]:
        """The token-stats pass's per-token statistics on every stage of ``pp_group``.

        ``outputs``: what the schedule returned (on the last stage one ``stats_function`` dict
        per micro-batch; ignored elsewhere). Returns ``logprob``, ``entropy`` (and with
        ``tabular`` ``sum_p2``, ``sum_p2_logp``), each fp32 ``[padded_rows, seq_length]``, equal
        on every stage: one ``broadcast_from_last_stage`` over the pipeline group. ``device``:
        where the other stages receive them.
        """
        names = STATS_NAMES + (TABULAR_NAMES if tabular else ())
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

    def token_chunks(self, stats: Mapping[str, Tensor]) -> list[TokenChunk]:
        """``prepare``'s input from :meth:`gather_stats`'s output, one chunk per micro-batch."""
        per_micro = {name: self.unpad(value) for name, value in stats.items()}
        return [
            TokenChunk(
                logprob=per_micro["logprob"][i],
                entropy=per_micro["entropy"][i],
                advantages=micro.advantages,
                mask=micro.response_mask,
                token_ids=micro.token_ids,
                sum_p2=per_micro["sum_p2"][i] if "sum_p2" in per_micro else None,
                sum_p2_logp=per_micro["sum_p2_logp"][i] if "sum_p2_logp" in per_micro else None,
            )
            for i, micro in enumerate(self.micros)
        ]


ForwardStep = Callable[[object, torch.nn.Module], tuple[Tensor, LossFunction | None]]
"""megatron's ``forward_step_func(data_iterator, model) -> (output, fn)``."""


def forward_step_func(
    make_fn: Callable[[Mapping[str, Tensor]], LossFunction], last: bool
) -> ForwardStep:
    """megatron's ``forward_step_func`` over this module's item iterators, for every stage.

    Takes the next item (every stage, every micro-batch), moves it to the model's device and runs
    ``model(input_ids, position_ids, None)`` (``None`` inputs on later stages: ``GPTModel`` then
    reads the previous stage's activations); causal attention, no mask. On the ``last`` stage the
    function is ``make_fn(item)`` (e.g. ``stats_function`` of ``item["targets"]``, or
    :func:`item_loss_function`); elsewhere ``None`` (the schedule never calls it there).
    """

    def forward_step(data_iterator, model: torch.nn.Module):
        device = next(model.parameters()).device
        item = {key: value.to(device) for key, value in next(data_iterator).items()}
        output = model(item.get("input_ids"), item.get("position_ids"), None)
        return output, make_fn(item) if last else None

    return forward_step


def item_loss_function(
    method: MethodConfig,
    item: Mapping[str, Tensor],
    scaling: MegatronScaling,
    logits_spec: VocabParallelLogits,
) -> LossFunction:
    """:func:`~.loss_closure.loss_function` of one last-stage loss-pass dict
    (:meth:`PipelineMicroBatches.loss_items`)."""
    missing = [key for key in LOSS_KEYS if key not in item]
    if missing:
        raise KeyError(f"loss-pass micro-batch lacks {missing}: is this the last stage's item?")
    micro = LossMicroBatch(
        targets=item["targets"],
        mask=item["mask"],
        advantages=item["advantages"],
        coefficients=Coefficients(
            delta_h=item["delta_h"], weight=item["weight"], selected=item["selected"]
        ),
        old_logprob=item.get("old_logprob"),
    )
    return loss_function(method, micro, int(item["n_tokens"]), scaling, logits_spec)
