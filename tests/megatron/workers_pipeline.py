"""Rank functions for the pipeline tests: an OPEFO step through megatron-core 0.16.1's real
1F1B pipelined schedule on a real ``GPTModel`` split into stages, and its single-process
reference (spawned by ``tests.parallel.world.run_world``)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from opefo_nemo.config.method import load_method
from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import TokenChunk, prepare
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.engines.megatron.loss_closure import (
    MegatronScaling,
    VocabParallelLogits,
    stats_function,
)
from opefo_nemo.engines.megatron.pipeline_batch import (
    PipelineMicroBatches,
    forward_step_func,
    item_loss_function,
)
from opefo_nemo.models.megatron_weights import (
    MegatronLayout,
    gather_shards,
    split_for_rank,
    stage_specs,
)
from opefo_nemo.parallel import DataParallelReducer

from .tiny import hf_config, megatron_gpt

VOCAB = 100
#: 100 padded to a multiple of 56 × TP is 112 at TP 1 and TP 2: the same weights in every layout.
DIVISIBLE_BY = 56
TEMPERATURE = 0.7
#: Three decoder layers: split unevenly at PP 2 (1 on the first stage, 2 on the last), so that a
#: wrong layer offset maps a gradient onto the wrong reference layer; one per stage at PP 3.
LAYERS = 3
METHOD = "opefo"


def layout(tp: int, pp: int) -> MegatronLayout:
    config = {**hf_config("llama"), "num_hidden_layers": LAYERS}
    return MegatronLayout.from_hf_config(
        config,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        make_vocab_size_divisible_by=DIVISIBLE_BY,
        first_stage_layers=1 if pp > 1 else None,
    )


def _model(lay: MegatronLayout, stage: int):
    return megatron_gpt(
        lay, stage, position_embedding_type="learned_absolute", max_sequence_length=16
    )


def _global_name(local: str, offset: int) -> str:
    """A stage-local parameter name under the full model's name (Megatron's layer offset)."""
    return re.sub(
        r"^decoder\.layers\.(\d+)\.", lambda m: f"decoder.layers.{int(m[1]) + offset}.", local
    )


def _positions(input_ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(input_ids.shape[1]).expand_as(input_ids)


def reference_step(rank: int, world_size: int, batch, out_dir: str) -> None:
    """TP 1, PP 1, the whole batch in one forward, no ``token_stats``, closure or schedule:
    random full weights, full-vocabulary ``log_softmax`` statistics (SPEC §1, tabular sums too),
    ``prepare`` in one process, ``L = Σ mask · (−w A logprob) / N`` (OPEFO, SPEC §5) and one
    autograd pass. Writes the weights, statistics, token count, λ* and every gradient."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state

    compat.initialize_model_parallel(1, 1, gloo_groups=False)
    try:
        with megatron_on_cpu():
            model = _model(layout(1, 1), 0)
            generator = torch.Generator().manual_seed(11)
            state = {}
            for name, tensor in model.state_dict().items():
                if not name.endswith("_extra_state"):
                    noise = torch.randn(tensor.shape, generator=generator)
                    state[name] = 1 + 0.1 * noise if "norm" in name else 0.3 * noise
            model.load_state_dict(state, strict=False)
            logits = model(batch.input_ids, _positions(batch.input_ids), None)
            logp = (logits[:, :-1, :VOCAB] / TEMPERATURE).log_softmax(-1)
            logprob = logp.gather(-1, batch.targets[..., None]).squeeze(-1)
            probs = logp.exp()
            entropy = -(probs * logp).sum(-1).detach()
            sum_p2 = probs.square().sum(-1).detach()
            sum_p2_logp = (probs.square() * logp).sum(-1).detach()
            chunk = TokenChunk(
                logprob=logprob.detach(),
                entropy=entropy,
                advantages=batch.advantages,
                mask=batch.response_mask,
                token_ids=batch.token_ids,
            )
            prepared = prepare(load_method(METHOD), [chunk], SingleProcessReducer())
            weight = prepared.coefficients[0].weight
            terms = -weight * batch.advantages * logprob * batch.response_mask
            terms.sum().div(prepared.n_tokens).backward()
            grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    finally:
        parallel_state.destroy_model_parallel()
    torch.save(
        {
            "state": state,
            "logprob": logprob.detach(),
            "entropy": entropy,
            "sum_p2": sum_p2,
            "sum_p2_logp": sum_p2_logp,
            "n_tokens": prepared.n_tokens,
            "lambda_star": prepared.lambda_star,
            "grads": grads,
        },
        Path(out_dir) / "reference.pt",
    )


def pipeline_step(
    rank: int,
    world_size: int,
    tp: int,
    pp: int,
    micro_batch_sizes: list[int],
    batch,
    state: dict[str, torch.Tensor],
    out_dir: str,
) -> None:
    """For each micro-batch size: the token-stats pass (forward only, tabular sums included)
    through the pipelined schedule, the stats broadcast from the last stage, ``prepare`` on every
    stage, the loss pass (forward and backward); writes ``mbs{m}_rank{r}.pt`` with this rank's
    stage, statistics, TP-gathered gradients under full-model names, loss-pass logprobs and the
    keys its iterator yielded."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state

    compat.initialize_model_parallel(tp, pp, gloo_groups=False)
    try:
        with megatron_on_cpu():
            lay = layout(tp, pp)
            stage = parallel_state.get_pipeline_model_parallel_rank()
            model = _model(lay, stage)
            _load(model, lay, stage, state)
            for micro_batch_size in micro_batch_sizes:
                result = _step(model, lay, stage, micro_batch_size, batch)
                torch.save(result, Path(out_dir) / f"mbs{micro_batch_size}_rank{rank}.pt")
    finally:
        parallel_state.destroy_model_parallel()


def _load(model, lay: MegatronLayout, stage: int, state: dict[str, torch.Tensor]) -> None:
    """This stage's and TP rank's share of the full-model ``state``."""
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    specs = {spec.name: spec for spec in stage_specs(lay, stage)}
    offset = lay.stage_layers(stage).start
    shards = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("_extra_state"):
            shards[name] = tensor
            continue
        full = state[_global_name(name, offset)]
        shards[name] = (
            split_for_rank(full, specs[name].sharding, lay.tensor_parallel, tp_rank, name)
            if name in specs
            else full.clone()
        )
    model.load_state_dict(shards, strict=True)


def _step(model, lay: MegatronLayout, stage: int, micro_batch_size: int, batch) -> dict:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    tp_group = parallel_state.get_tensor_model_parallel_group()
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    method = load_method(METHOD)
    spec = VocabParallelLogits(tp_group, VOCAB, TEMPERATURE)
    plan = PipelineMicroBatches.split(batch, micro_batch_size)
    scaling = MegatronScaling(plan.num_microbatches, 1)
    keys_seen: list[tuple[str, ...]] = []

    def recorded(items: list[dict]):
        """The items, noting the keys of each one the schedule takes."""
        for item in items:
            keys_seen.append(tuple(item))
            yield item

    def run(items: list[dict], make_fn, forward_only: bool) -> list[dict]:
        return get_forward_backward_func()(
            forward_step_func=forward_step_func(make_fn, last),
            data_iterator=recorded(items),
            model=model,
            num_microbatches=plan.num_microbatches,
            seq_length=plan.seq_length,
            micro_batch_size=plan.micro_batch_size,
            forward_only=forward_only,
        )

    with torch.no_grad():
        outputs = run(
            plan.stats_items(first, last),
            lambda item: stats_function(item["targets"], spec, tabular=True),
            True,
        )
    stats = plan.gather_stats(outputs, pp_group, tabular=True)
    prepared = prepare(
        method,
        plan.token_chunks(stats),
        DataParallelReducer(parallel_state.get_data_parallel_group()),
    )
    model.zero_grad(set_to_none=True)
    items = plan.loss_items(prepared.coefficients, prepared.n_tokens, first, last)
    losses = run(items, lambda item: item_loss_function(method, item, scaling, spec), False)

    loss_logprob = _rows(plan, torch.cat([out["logprob"] for out in losses])) if last else None
    return {
        "stage": stage,
        "first": first,
        "last": last,
        "keys": keys_seen,
        "num_microbatches": plan.num_microbatches,
        "stats": {name: _rows(plan, value) for name, value in stats.items()},
        "loss_logprob": loss_logprob,
        "n_tokens": prepared.n_tokens,
        "lambda_star": prepared.lambda_star,
        "grads": _full_grads(model, lay, stage, tp_group),
    }


def _rows(plan: PipelineMicroBatches, stacked: torch.Tensor) -> dict[int, torch.Tensor]:
    """Row index in the shard → that row's per-token values over its micro-batch's width."""
    rows, first = {}, 0
    for micro, values in zip(plan.micros, plan.unpad(stacked), strict=True):
        for i in range(micro.rows):
            rows[first + i] = values[i].clone()
        first += micro.rows
    return rows


def _full_grads(model, lay: MegatronLayout, stage: int, tp_group) -> dict[str, torch.Tensor]:
    """This stage's gradients, gathered over TP, under the full model's names."""
    specs = {spec.name: spec for spec in stage_specs(lay, stage)}
    offset = lay.stage_layers(stage).start
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if name in specs and lay.tensor_parallel > 1:
            parts = [torch.empty_like(grad) for _ in range(lay.tensor_parallel)]
            dist.all_gather(parts, grad.contiguous(), group=tp_group)
            grad = gather_shards(parts, specs[name].sharding, name)
        grads[_global_name(name, offset)] = grad.clone()
    return grads
