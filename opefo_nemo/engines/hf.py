"""``hf``: the trainer's ``Policy`` on a Hugging Face causal LM from a local directory, on one
device, with AdamW and the warm-up schedule of spec §8 (docs/training.md)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core.deferred_checks import deferred_checks
from opefo_nemo.engines.batch import TrainBatch, to_device
from opefo_nemo.engines.batch_layout import MicroBatchLayout, plan_layouts
from opefo_nemo.engines.entropy_correction import CapturedEntropyGradient, on_one_device
from opefo_nemo.engines.master_weights import MasterWeights
from opefo_nemo.engines.protocols import EngineStepResult, LossFn
from opefo_nemo.engines.schedule import warmup_factor
from opefo_nemo.models.directory import copy_beside_weights
from opefo_nemo.models.transformers_compat import (
    last_logits_keyword,
    load_causal_lm,
    quiet_progress,
)
from opefo_nemo.parallel import NonFiniteLogitsError, TokenStats, requested_sums, token_stats

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_STATE_FILE = "engine_state.pt"
MODEL_SUBDIR = "model"


class HFPolicy:
    """A causal LM loaded from ``model_dir`` (nothing is downloaded) with AdamW and the learning
    rate ``lr ·`` :func:`~.schedule.warmup_factor` at each rollout step; gradient clipping by
    global norm. ``engine.dtype=bfloat16`` is mixed precision: the model computes in bf16,
    AdamW updates fp32 master weights (:class:`~.master_weights.MasterWeights`)."""

    def __init__(
        self, model_dir: str | Path, config: EngineConfig, *, lr: float, temperature: float
    ):
        path = Path(model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path {path} is not a Hugging Face model directory")
        self.source_dir = path
        self.config = config
        self.temperature = temperature
        self.device = torch.device(config.device)
        attention = None if config.attention == "default" else config.attention
        self.model = load_causal_lm(path, torch.float32, attention)
        self.model.to(self.device).train()
        self.weights = MasterWeights(self.model, _DTYPES[config.dtype])
        self.optimizer = torch.optim.AdamW(
            self.weights.masters,
            lr=lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: warmup_factor(step, warmup)
        )

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def data_parallel_size(self) -> int:
        """One device: one rank runs every micro-batch."""
        return 1

    @property
    def sequence_multiple(self) -> int:
        """Each micro-batch runs at its longest row's width."""
        return 1

    def _stats(self, batch: TrainBatch, sums: Sequence[str] = ()) -> TokenStats:
        """``parallel.token_stats`` (TP = 1) at the rollout's sampling temperature (spec §1) with
        ``engine.stats_kernel``: both phases differentiate the policy that generated the rollout.

        The output layer and the statistics run from ``batch.first_response_column`` on: the
        columns before it predict prompt tokens in every row, which every use of the statistics
        masks out (spec §5), and hold 0. With a shared chat template that is most of the prompt,
        a third or more of a short-answer batch's tokens and of its ``[tokens, V]`` logits."""
        ids = to_device(batch.input_ids, self.device)
        attention = to_device(batch.attention_mask, self.device)
        first = batch.first_response_column
        kept = ids.shape[1] - first
        logits = self.model(
            input_ids=ids,
            attention_mask=attention.long(),
            **last_logits_keyword(self.model, kept),
        ).logits[:, -kept:-1]
        stats = token_stats(
            logits,
            ids[:, first + 1 :],
            temperature=self.temperature,
            sums=sums,
            chunk_size=self.config.stats_chunk_tokens,
            kernel=self.config.stats_kernel,
        )
        return stats if first == 0 else stats.map(lambda t: torch.nn.functional.pad(t, (first, 0)))

    @property
    def shares_forward(self) -> bool:
        """``engine.shared_forward``: a strict step's statistics come from
        :meth:`forward_with_graph`, whose graphs the step's backward passes reuse."""
        return self.config.shared_forward

    def forward_with_graph(
        self, micro_batches: Sequence[TrainBatch], sums: Sequence[str] = ()
    ) -> list[TokenStats]:
        """Phase 1 for the micro-batches of one optimizer step, with each micro-batch's graph
        kept: its statistics (with the vocabulary ``sums``), on :attr:`device`, to pass as
        ``kept`` to :meth:`capture_entropy_gradient` and :meth:`train_step`, whose backward
        passes then run no forward. The checks are those of :meth:`token_stats`."""
        kept = []
        with deferred_checks() as checks:
            for index, micro in enumerate(micro_batches):
                checks.label = f"micro-batch {index} of the token-stats pass"
                kept.append(self._stats(micro, sums))
        error = checks.first_error()
        if error is not None:
            raise error
        return kept

    @torch.no_grad()
    def token_stats(
        self,
        batch: TrainBatch,
        *,
        sums: Sequence[str] = (),
        layout: MicroBatchLayout | None = None,
    ) -> TokenStats:
        """Phase 1: ``[B, T − 1]`` fp32 statistics (with the vocabulary ``sums`` asked for) on
        the CPU in ``batch``'s row order, no graph; one forward per micro-batch of ``layout``
        (``None``: :func:`~.batch_layout.plan_layouts` with ``engine.micro_batch_size``,
        ``engine.batch_layout`` and ``engine.max_tokens_per_micro_batch``), each trimmed to its
        longest row (the columns past it, and those before its first response column, are 0).
        The statistics stay on the device until the last micro-batch, the checks of every
        micro-batch are read once at the end (:mod:`~opefo_nemo.core.deferred_checks`), then
        one copy to the host."""
        if layout is None:
            lengths = batch.attention_mask.sum(dim=1).tolist()
            (layout,) = plan_layouts(
                lengths,
                micro_batch_size=self.config.micro_batch_size,
                max_tokens=self.config.max_tokens_per_micro_batch,
                layout=self.config.batch_layout,
            )
        if not layout.covers(batch.rows):
            raise ValueError(f"the layout's rows do not cover the batch's {batch.rows} rows once")
        names = ("logprob", "entropy", *requested_sums(sums))
        shape = (len(names), *batch.targets.shape)
        out = torch.zeros(shape, dtype=torch.float32, device=self.device)
        with deferred_checks() as checks:
            for index, rows in enumerate(layout.rows):
                checks.label = f"micro-batch {index} of the token-stats pass"
                micro = batch.select(rows)
                place = to_device(torch.tensor(rows), self.device)
                width = micro.targets.shape[1]
                fields = self._stats(micro, sums).present()
                for field, name in enumerate(names):
                    out[field, place, :width] = fields[name]
        error = checks.first_error()
        if error is not None:
            raise error
        return TokenStats(**dict(zip(names, out.cpu(), strict=True)))

    def _backward(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: LossFn,
        sum_names: Sequence[str],
        kept: Sequence[TokenStats] | None,
        retain_graph: bool = False,
    ) -> tuple[bool, dict[str, Tensor]]:
        """A forward with gradient (or micro-batch ``i``'s ``kept[i]``, whose graph the backward
        keeps when ``retain_graph``) and ``loss_fn(i, stats).loss.backward()`` for every
        micro-batch; returns whether a loss or the logits were not finite and the summed
        ``LossOutput.sums`` (keys ``sum_names``). The checks of ``token_stats`` and of the loss
        run on the device and are read once, after the last backward: the first failing one
        decides, as if it had raised in its micro-batch (non-finite logits skip the step, any
        other error is raised)."""
        if kept is not None and len(kept) != len(micro_batches):
            raise ValueError(f"{len(kept)} kept forwards for {len(micro_batches)} micro-batches")
        sums = {
            name: torch.zeros((), dtype=torch.float64, device=self.device) for name in sum_names
        }
        nonfinite = torch.zeros((), device=self.device)
        with deferred_checks() as checks:
            for index, micro in enumerate(micro_batches):
                checks.label = f"micro-batch {index} of the loss pass"
                out = loss_fn(index, self._stats(micro) if kept is None else kept[index])
                nonfinite += (~torch.isfinite(out.loss.detach())).float()
                if set(out.sums) != set(sums):
                    raise ValueError(f"loss sums {sorted(out.sums)} are not {sorted(sums)}")
                sums = {k: total + out.sums[k].detach() for k, total in sums.items()}
                out.loss.backward(retain_graph=retain_graph)
                self.weights.accumulate_grads()
        error = checks.first_error()
        if error is not None and not isinstance(error, NonFiniteLogitsError):
            raise error
        return error is not None or bool(nonfinite > 0), sums

    def capture_entropy_gradient(
        self,
        micro_batches: Sequence[TrainBatch],
        entropy_fn: LossFn,
        owners: Sequence[int] | None = None,
        kept: Sequence[TokenStats] | None = None,
    ) -> CapturedEntropyGradient | None:
        """``∇θ H̄`` of every parameter (``Policy.capture_entropy_gradient``; one rank runs
        every micro-batch, whatever ``owners`` says): the ``grad`` tensors of the optimizer's
        (fp32) tensors, detached from them (one more fp32 copy of the weights); a move along it
        is published into the bf16 parameters in mixed precision. With ``kept``
        (:meth:`forward_with_graph`) the graphs stay for :meth:`train_step`."""
        self.weights.zero_grad()
        failed, _ = self._backward(
            micro_batches, entropy_fn, (), kept, retain_graph=kept is not None
        )
        masters = self.weights.masters
        grads = [torch.zeros_like(m) if m.grad is None else m.grad for m in masters]
        self.weights.zero_grad()
        finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()
        if failed or not bool(finite):  # one host read
            return None
        return CapturedEntropyGradient(
            masters, grads, [True] * len(masters), on_one_device, self.weights.publish
        )

    def train_step(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: LossFn,
        sum_names: Sequence[str],
        owners: Sequence[int] | None = None,
        kept: Sequence[TokenStats] | None = None,
    ) -> EngineStepResult:
        """Accumulate every micro-batch's gradient and metric sums (each loss is already its share
        of the global token mean, spec §5: nothing is rescaled; one rank runs every micro-batch,
        whatever ``owners`` says), clip, step; skip the step if
        anything is NaN. The statistics reach ``loss_fn`` on :attr:`device` (``kept``: those of
        :meth:`forward_with_graph`, no forward is run); finiteness is checked once, after the
        last backward."""
        self.weights.zero_grad()
        failed, sums = self._backward(micro_batches, loss_fn, sum_names, kept)
        masters = [m for m in self.weights.masters if m.grad is not None]
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(masters, max_norm)) if masters else 0.0
        if failed or not math.isfinite(grad_norm):
            self.weights.zero_grad()
            return EngineStepResult(grad_norm=float("nan"), lr=self.lr, skipped=True)
        self.optimizer.step()
        self.weights.publish()
        self.weights.zero_grad()
        return EngineStepResult(
            grad_norm=grad_norm,
            lr=self.lr,
            skipped=False,
            sums=dict(zip(sums, torch.stack(list(sums.values())).tolist(), strict=True))
            if sums
            else {},
        )

    def advance_schedule(self) -> None:
        self.scheduler.step()

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """``(hf_name, tensor)`` for every parameter as the model computes with it (bf16 in
        mixed precision), detached (tied weights appear once)."""
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    def save(self, directory: Path) -> None:
        """``model/`` (a Hugging Face directory that loads on its own: :meth:`save_model`) and
        the optimizer and scheduler state."""
        directory.mkdir(parents=True, exist_ok=True)
        self.save_model(directory / MODEL_SUBDIR)
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(state, directory / _STATE_FILE)

    def save_model(self, directory: Path) -> None:
        """The weights as a Hugging Face directory that vLLM and ``opefo-eval`` load on their own:
        the fp32 masters (the parameters themselves in fp32), so a resumed run continues from
        exactly the weights it saved, beside the source directory's tokenizer, chat template and
        other files (:func:`~opefo_nemo.models.directory.copy_beside_weights`)."""
        state = self.model.state_dict()
        owners = {
            param.data_ptr(): master
            for param, master in zip(self.weights.params, self.weights.masters, strict=True)
        }
        state = {name: owners.get(t.data_ptr(), t) for name, t in state.items()}
        with quiet_progress():
            self.model.save_pretrained(directory, state_dict=state, safe_serialization=True)
        copy_beside_weights(self.source_dir, directory)

    def load(self, directory: Path) -> None:
        from safetensors.torch import load_file

        weights = directory / MODEL_SUBDIR / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(
                f"checkpoint {directory} has no {MODEL_SUBDIR}/model.safetensors"
            )
        tensors = load_file(weights)
        missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
        if unexpected or set(missing) - tied:
            raise ValueError(
                f"checkpoint {weights} does not match the model: missing {missing}, "
                f"unexpected {unexpected}"
            )
        self.weights.load(tensors)
        state = torch.load(directory / _STATE_FILE, map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
