"""The trainer's ``Policy`` on a megatron-core GPT model inside ``parallel_state``
(docs/megatron.md).

SPMD: every rank of the job (all TP × PP × DP ranks) calls every method with the *same* arguments
(the trainer loop runs on every rank); collectives inside keep the ranks in step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel
from megatron.core.optimizer import MegatronOptimizer
from torch import Tensor

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.core.deferred_checks import deferred_checks
from opefo_nemo.engines.batch import TrainBatch
from opefo_nemo.engines.batch_layout import MicroBatchLayout, plan_layouts
from opefo_nemo.engines.entropy_correction import CapturedEntropyGradient
from opefo_nemo.engines.megatron.checkpoint import load_megatron, save_megatron
from opefo_nemo.engines.megatron.fused_output import gpt_model
from opefo_nemo.engines.megatron.loss_closure import (
    LossFunction,
    MegatronScaling,
    output_stats,
    stats_function,
)
from opefo_nemo.engines.megatron.model_checks import check_model, check_tied_copies
from opefo_nemo.engines.megatron.optimizer_step import MegatronOptimizerStep
from opefo_nemo.engines.megatron.pipeline_batch import PipelineMicroBatches
from opefo_nemo.engines.megatron.schedule_driver import (
    contiguous_owners,
    gather_rows,
    owned,
    run_schedule,
)
from opefo_nemo.engines.protocols import EngineStepResult, LossFn
from opefo_nemo.models.megatron_weights.layout import MegatronLayout
from opefo_nemo.models.megatron_weights.streaming import DistributedFetch, hf_named_weights
from opefo_nemo.parallel import NonFiniteLogitsError, TokenStats, requested_sums

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_SCHEDULE = "lr_schedule"


class MegatronPolicy:
    """``Policy`` on this rank's megatron-core ``GPTModel``.

    ``model``: the rank's model (one chunk: no virtual pipeline stages), built for ``layout`` and
    this rank's TP rank, inside megatron's ``DistributedDataParallel``
    (:func:`~.megatron_optimizer.wrap_in_ddp`); ``optimizer``: a ``MegatronOptimizer`` over it
    (:func:`~.megatron_optimizer.build_megatron_optimizer`: bf16 parameters with fp32 main
    weights and gradients, or fp32 ones; with or without the distributed optimizer);
    ``temperature``: the rollout's sampling temperature (spec §1). Tied embeddings at PP > 1
    must start bit-equal (:func:`~.model_checks.check_tied_copies`); with sequence parallelism
    sequences are padded to a multiple of TP (:attr:`sequence_multiple`). Not supported: virtual
    pipeline stages.
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        optimizer: MegatronOptimizer,
        config: MegatronEngineConfig,
        *,
        layout: MegatronLayout,
        temperature: float,
    ) -> None:
        if not isinstance(optimizer, MegatronOptimizer):
            raise TypeError(
                f"MegatronPolicy takes a MegatronOptimizer (build_megatron_optimizer) over the "
                f"model in megatron's DistributedDataParallel, got {type(optimizer).__name__}"
            )
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                f"MegatronPolicy takes the model wrapped in megatron-core's "
                f"DistributedDataParallel (wrap_in_ddp), got {type(model).__name__}"
            )
        if not parallel_state.model_parallel_is_initialized():
            raise RuntimeError("MegatronPolicy needs megatron-core's parallel_state initialized")
        self.model, self.optimizer, self.config, self.layout = model, optimizer, config, layout
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.model_parallel_group = parallel_state.get_model_parallel_group()
        check_model(model, layout, config.dtype)
        if layout.pipeline_parallel > 1 and layout.shape.tie_word_embeddings:
            check_tied_copies(model, self.pp_group)
        self.outputs = output_stats(
            model, self.tp_group, layout.shape.vocab_size, temperature, config
        )
        groups = (self.dp_group, self.model_parallel_group)
        self.updates = MegatronOptimizerStep(model, optimizer, config, *groups)

    @property
    def device(self) -> torch.device:
        """This rank's training device (where ``loss_fn`` receives its statistics)."""
        return next(self.model.parameters()).device

    @property
    def sequence_multiple(self) -> int:
        """What every micro-batch's width is rounded up to: sequence parallelism splits each
        sequence over the TP ranks, so a multiple of TP then (the padding is masked like any
        other), else 1. The trainer's layout planner counts the padding with it."""
        return self.layout.tensor_parallel if self.config.sequence_parallel else 1

    @property
    def lr(self) -> float:
        """This rollout step's learning rate (:func:`~..schedule.warmup_factor`), as ``hf``'s."""
        return self.updates.lr

    @property
    def data_parallel_size(self) -> int:
        """The data-parallel ranks the micro-batches of a pass are dealt to."""
        return parallel_state.get_data_parallel_world_size()

    @property
    def _dp(self) -> tuple[int, int]:
        """``(data-parallel size, this rank's data-parallel rank)``."""
        return self.data_parallel_size, parallel_state.get_data_parallel_rank()

    @torch.no_grad()
    def token_stats(
        self,
        batch: TrainBatch,
        *,
        sums: Sequence[str] = (),
        layout: MicroBatchLayout | None = None,
    ) -> TokenStats:
        """Phase 1: ``[B, T − 1]`` fp32 statistics of the whole ``batch`` (with the vocabulary
        ``sums`` asked for) on every rank (CPU), in ``batch``'s row order.

        ``layout`` says which rows form each micro-batch and which DP rank runs it (its rows
        cover every row of ``batch`` once); ``None``: one planned with the engine's own
        ``batch_layout``, ``micro_batch_size`` and ``max_tokens_per_micro_batch``
        (:func:`~opefo_nemo.engines.batch_layout.plan_layouts`, one mini-batch). Each rank runs the
        micro-batches it owns through the forward-only schedule, each at its own width
        (:class:`~.pipeline_batch.PipelineMicroBatches`), with
        :func:`~.loss_closure.stats_function` (vocab-parallel over TP, padded vocabulary
        excluded, the rollout temperature) on the last pipeline stage, which broadcasts them to
        the others (``engine.stats_kernel=fused_linear``: from the final hidden states,
        :mod:`.fused_output`); the rows are then all-gathered over DP and put back by row
        index (:func:`~.schedule_driver.gather_rows`), so the trainer's ``prepare`` is identical
        on every rank. The checks of every micro-batch are read once after the schedule
        (:mod:`~opefo_nemo.core.deferred_checks`) and the statistics stay on the device until one
        copy to the host after the gather."""
        size, rank = self._dp
        if layout is None:
            lengths = batch.attention_mask.sum(dim=1).tolist()
            (layout,) = plan_layouts(
                lengths,
                data_parallel=size,
                micro_batch_size=self.config.micro_batch_size,
                max_tokens=self.config.max_tokens_per_micro_batch,
                multiple=self.sequence_multiple,
                layout=self.config.batch_layout,
            )
        if not layout.covers(batch.rows):
            raise ValueError(f"the layout's rows do not cover the batch's {batch.rows} rows once")
        if layout.data_parallel != size:
            raise ValueError(f"a layout for {layout.data_parallel} data-parallel ranks, not {size}")
        shares = [[row for i in layout.of_rank(r) for row in layout.rows[i]] for r in range(size)]
        names = ("logprob", "entropy", *requested_sums(sums))
        width = batch.input_ids.shape[1] - 1
        local = torch.zeros((len(names), 0, width), dtype=torch.float32, device=self.device)
        error: Exception | None = None
        mine = [batch.select(layout.rows[i]) for i in layout.of_rank(rank)]
        if mine:
            local, error = self._shard_stats(mine, names, width)
        full = gather_rows(local, shares, batch.rows, self.dp_group).cpu()
        if error is not None:
            raise error
        if bool(torch.isnan(full).any()):
            raise NonFiniteLogitsError(
                "token_stats: non-finite logits on another data-parallel rank's last stage"
            )
        return TokenStats(**dict(zip(names, full, strict=True)))

    def _shard_stats(
        self, micro_batches: Sequence[TrainBatch], names: Sequence[str], width: int
    ) -> tuple[Tensor, Exception | None]:
        """This rank's ``micro_batches`` through the forward-only schedule: the statistics
        ``[len(names), rows, width]`` fp32 on the device (their rows in order), and non-finite
        logits as an error to raise after the gather (its rows NaN, so the other ranks learn
        of it); any other failed check is raised at once."""
        micros = PipelineMicroBatches(tuple(micro_batches), self.sequence_multiple)
        order = iter(range(micros.num_microbatches))

        def make_fn(item: Mapping[str, Tensor]) -> LossFunction:
            checks.label = f"micro-batch {next(order)} of the token-stats pass"
            return stats_function(item["targets"], self.outputs, names[2:])

        with deferred_checks() as checks:  # recorded on the last stage, every TP rank
            outputs = run_schedule(
                self.model,
                micros,
                make_fn,
                forward_only=True,
                stop_before_output_layer=self.outputs.stops_before_output_layer,
            )
        error = checks.first_error()
        if error is not None and not isinstance(error, NonFiniteLogitsError):
            raise error
        if error is not None:
            outputs = [
                dict.fromkeys(names, torch.full(shape, math.nan, device=self.device))
                for shape in micros.shapes
            ]
        stats = micros.gather_stats(outputs, names, width, self.pp_group, self.device)
        return stats, error

    def train_step(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: LossFn,
        sum_names: Sequence[str],
        owners: Sequence[int] | None = None,
    ) -> EngineStepResult:
        """Phase 3 (spec §5): one optimizer step over all ``micro_batches`` of the step.

        ``owners[i]``: the DP rank that runs micro-batch ``i`` (:meth:`_backward`); ``None``:
        equal contiguous blocks. Then the gradients' DP reduction, the global norm over TP and
        PP, clipping to ``config.grad_clip`` and the optimizer step (:mod:`.optimizer_step`). A
        non-finite loss or logits on any rank, or a non-finite gradient, skips the step on every
        rank (gradients dropped, ``EngineStepResult(nan, lr, skipped=True)``), as ``HFPolicy``
        does. The loss's finiteness and metric sums accumulate on the device and are read once,
        after the backward."""
        self.updates.zero_grad()
        failed, sums = self._backward(micro_batches, loss_fn, sum_names, owners)
        if self.updates.reduce(failed):  # the same on every rank
            self.updates.zero_grad()
            return EngineStepResult(grad_norm=math.nan, lr=self.lr, skipped=True)
        totals = self._reduce_sums(sums, sum_names)
        grad_norm = self.updates.step()
        return EngineStepResult(grad_norm=grad_norm, lr=self.lr, skipped=False, sums=totals)

    def capture_entropy_gradient(
        self,
        micro_batches: Sequence[TrainBatch],
        entropy_fn: LossFn,
        owners: Sequence[int] | None = None,
    ) -> CapturedEntropyGradient | None:
        """``Policy.capture_entropy_gradient``: :meth:`train_step`'s schedule and reduction with
        ``entropy_fn`` (and the same ``owners``), then the reduced gradient kept in the
        optimizer's layout
        (:meth:`.optimizer_step.MegatronOptimizerStep.capture_entropy_gradient`)."""
        self.updates.zero_grad()
        failed, _ = self._backward(micro_batches, entropy_fn, (), owners)
        if self.updates.reduce(failed):  # the same on every rank
            self.updates.zero_grad()
            return None
        return self.updates.capture_entropy_gradient()

    def _backward(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: LossFn,
        sum_names: Sequence[str],
        owners: Sequence[int] | None,
    ) -> tuple[Tensor, Tensor]:
        """This rank's micro-batches through the schedule with gradient, each at its own width;
        returns the device flag of a non-finite loss or logits and the summed
        ``LossOutput.sums`` (in ``sum_names`` order, this rank's micro-batches only, non-zero on
        the last stage).

        Micro-batch ``i`` belongs to DP rank ``owners[i]`` (``None``:
        :func:`~.schedule_driver.contiguous_owners`); ranks may own different numbers of them,
        or none. The last stage's loss is ``loss_fn(i, stats_with_grad)`` ×
        ``MegatronScaling(n, D).factor`` with ``n`` this rank's own count, which undoes
        megatron's ``1/num_microbatches`` and DDP's ``1/D`` (the trainer's closure holds the
        coefficients, already on the device: only tokens and targets travel with the
        micro-batches). The checks of ``token_stats`` and of the loss are read once, after the
        schedule: the first failing one decides, as if it had raised in its micro-batch
        (non-finite logits fail the step, any other error is raised). A rank that owns nothing
        runs no schedule (its gradient is 0 in the DP reduction), except with
        ``engine.overlap_grad_reduce``: megatron's DDP starts each bucket's reduction from the
        gradient hooks of the last micro-batch's backward (``finish_grad_sync`` asserts it was
        started), so such a rank runs the step's first micro-batch with its loss × 0, whose
        backward fires the same hooks in the same order as the other ranks'."""
        size, rank = self._dp
        count = len(micro_batches)
        if not count:
            raise ValueError("a step needs at least one micro-batch")
        given = contiguous_owners(count, size) if owners is None else owners
        mine = owned(given, count, size, rank)
        stand_in = not mine and self.config.overlap_grad_reduce
        failed = torch.zeros((), device=self.device)
        names = tuple(sum_names)
        sums = torch.zeros(len(names), dtype=torch.float64, device=self.device)
        if not mine and not stand_in:
            return failed, sums
        run = mine or [0]
        scaling = MegatronScaling(len(run), size)
        order = iter(run)

        def make_fn(item: Mapping[str, Tensor]) -> LossFunction:
            index = next(order)  # the last stage builds the functions in micro-batch order
            rows, width = micro_batches[index].targets.shape

            def compute(output: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
                nonlocal failed, sums
                checks.label = f"micro-batch {index} of the loss pass"
                stats = self.outputs.stats(output, item["targets"])
                if stand_in:
                    return (stats.logprob.sum() + stats.entropy.sum()) * 0.0, {}
                out = loss_fn(
                    index, TokenStats(stats.logprob[:rows, :width], stats.entropy[:rows, :width])
                )
                failed = failed + (~torch.isfinite(out.loss.detach())).float()
                sums = sums + _sum_vector(out.sums, names, sums)
                return out.loss * scaling.factor, {}

            return compute

        micros = PipelineMicroBatches(tuple(micro_batches[i] for i in run), self.sequence_multiple)
        with deferred_checks() as checks:
            run_schedule(
                self.model,
                micros,
                make_fn,
                forward_only=False,
                stop_before_output_layer=self.outputs.stops_before_output_layer,
            )
        error = checks.first_error()  # recorded on the last stage; one read per step
        if error is not None and not isinstance(error, NonFiniteLogitsError):
            raise error
        return failed + float(error is not None), sums

    def _reduce_sums(self, sums: Tensor, names: Sequence[str]) -> dict[str, float]:
        """This rank's metric sums (non-zero on the last pipeline stage only) added over the
        pipeline and data-parallel groups: every rank returns the step's totals (added in
        another order than on one device: float64 round-off)."""
        for group in (self.pp_group, self.dp_group):
            if dist.get_world_size(group) > 1:
                dist.all_reduce(sums, group=group)
        return dict(zip(names, sums.tolist(), strict=True))

    def advance_schedule(self) -> None:
        self.updates.advance()

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """Every Hugging Face weight once (tied ``lm_head`` not repeated), gathered over TP and
        PP one decoder layer at a time (``DistributedFetch``); identical on every rank, and every
        rank must iterate it to the end."""
        state = {k: v for k, v in self.model.state_dict().items() if "_extra_state" not in k}
        fetch = DistributedFetch(
            self.layout,
            state,
            self.tp_group,
            self.pp_group,
            _DTYPES[self.config.dtype],
            device=self.device,
        )
        yield from hf_named_weights(self.layout, fetch)

    def save(self, directory: Path) -> None:
        """Model, optimizer state and learning-rate schedule into ``directory``, a megatron
        ``torch_dist`` checkpoint (:mod:`.checkpoint`; collective, every rank writes its
        shards); the schedule's state travels in the checkpoint's JSON ``extra``."""
        save_megatron(
            directory, gpt_model(self.model), self.optimizer, {_SCHEDULE: self.updates.steps}
        )

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote (collective): any layout resumes without the
        distributed optimizer, the same TP × PP with it."""
        extra = load_megatron(directory, gpt_model(self.model), self.optimizer)
        if _SCHEDULE not in extra:
            raise ValueError(f"checkpoint {directory} holds no learning-rate schedule state")
        self.updates.steps = int(extra[_SCHEDULE])


def _sum_vector(part: Mapping[str, Tensor], names: Sequence[str], like: Tensor) -> Tensor:
    """``LossOutput.sums`` as a vector in ``names`` order (the keys must be exactly ``names``)."""
    if set(part) != set(names):
        raise ValueError(f"loss sums {sorted(part)} are not {sorted(names)}")
    if not names:
        return like.new_zeros((0,))
    return torch.stack([part[k].detach().reshape(()).to(like) for k in names])
