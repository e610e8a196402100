"""Rank function for the loss-closure tests: one OPEFO step through megatron-core's real
no-pipelining schedule on a real ``GPTModel`` (spawned by ``tests.parallel.world.run_world``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import TokenChunk, prepare
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.engines.megatron.data_parallel import shard_for_group, shard_rows
from opefo_nemo.engines.megatron.loss_closure import (
    MegatronScaling,
    VocabParallelLogits,
    loss_function,
    loss_micro_batch,
    per_position,
    stats_function,
)
from opefo_nemo.models.megatron_weights import (
    MegatronLayout,
    gather_shards,
    split_for_rank,
    weight_groups,
)
from opefo_nemo.parallel import DataParallelReducer

from .tiny import hf_config, megatron_gpt

VOCAB = 100
#: 100 padded to a multiple of 56 × TP is 112 at TP 1 and TP 2: the same weights in every layout.
DIVISIBLE_BY = 56
TEMPERATURE = 0.7


def _layout(tp: int) -> MegatronLayout:
    config = {**hf_config("llama"), "num_hidden_layers": 2}
    return MegatronLayout.from_hf_config(
        config, tensor_parallel=tp, make_vocab_size_divisible_by=DIVISIBLE_BY
    )


def _specs(lay: MegatronLayout) -> dict:
    return {spec.name: spec for group in weight_groups(lay) for spec in group}


def _draw_state(model) -> dict[str, torch.Tensor]:
    """Random full weights of scale large enough for non-uniform softmaxes (norms near 1)."""
    generator = torch.Generator().manual_seed(11)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("_extra_state"):
            continue
        noise = torch.randn(tensor.shape, generator=generator)
        state[name] = 1 + 0.1 * noise if "norm" in name else 0.3 * noise
    return state


def _load(model, lay: MegatronLayout, state, tp_rank: int) -> None:
    specs = _specs(lay)
    shards = {
        name: split_for_rank(full, specs[name].sharding, lay.tensor_parallel, tp_rank, name)
        if name in specs
        else full.clone()
        for name, full in state.items()
    }
    extra = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
    model.load_state_dict({**extra, **shards}, strict=True)


def _full_grads(model, lay: MegatronLayout, tp_group) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, gathered over TP into the full (TP 1) tensor."""
    specs = _specs(lay)
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if name in specs and lay.tensor_parallel > 1:
            parts = [torch.empty_like(grad) for _ in range(lay.tensor_parallel)]
            dist.all_gather(parts, grad.contiguous(), group=tp_group)
            grad = gather_shards(parts, specs[name].sharding, name)
        grads[name] = grad.clone()
    return grads


def _forward_step(model, sequence_first: bool):
    """megatron's ``forward_step_func``: the next item's model inputs and its loss function.
    Sequence-first logits are the output layer's own ``[s, b, V/TP]`` output (a forward hook),
    the others ``GPTModel.forward``'s ``[b, s, V/TP]``."""
    captured = {}
    model.output_layer.register_forward_hook(lambda m, i, out: captured.update(logits=out[0]))

    def forward_step(data_iterator, model):
        input_ids, fn = next(data_iterator)
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        out = model(input_ids, positions, None)
        return (captured["logits"] if sequence_first else out), fn

    return forward_step


def _independent_grads(model, batch, chunk_weight, n_tokens) -> dict[str, torch.Tensor]:
    """TP 1 reference without token_stats, closure or schedule: full-vocabulary log-softmax and
    ``L = Σ mask · (−w A logprob) / N`` (OPEFO, SPEC §5), one autograd pass."""
    model.zero_grad(set_to_none=True)
    positions = torch.arange(batch.input_ids.shape[1]).expand_as(batch.input_ids)
    logits = model(batch.input_ids, positions, None)[:, :-1, :VOCAB] / TEMPERATURE
    logprob = logits.log_softmax(-1).gather(-1, batch.targets[..., None]).squeeze(-1)
    terms = -chunk_weight * batch.advantages * logprob
    (terms * batch.response_mask).sum().div(n_tokens).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def closure_step(
    rank: int,
    world_size: int,
    tp: int,
    micro_batch_size: int,
    method_name: str,
    sequence_first: bool,
    batch,
    state,
    out_dir: str,
) -> None:
    """One step: sharded stats pass, ``prepare`` over DP, loss pass, DDP's average; writes the
    gathered gradients and per-row logprobs of both passes to ``out_dir``. ``state=None``: the
    reference (draws the weights and saves them; for OPEFO its gradients are checked against
    :func:`_independent_grads`)."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state

    compat.initialize_model_parallel(tp, 1, gloo_groups=False)
    try:
        with megatron_on_cpu():
            _step(tp, micro_batch_size, method_name, sequence_first, batch, state, Path(out_dir))
    finally:
        parallel_state.destroy_model_parallel()


def _step(tp, micro_batch_size, method_name, sequence_first, batch, state, out: Path) -> None:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    tp_group = parallel_state.get_tensor_model_parallel_group()
    dp_group = parallel_state.get_data_parallel_group()
    dp, dp_rank = dist.get_world_size(dp_group), dist.get_rank(dp_group)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    lay = _layout(tp)
    model = megatron_gpt(lay, position_embedding_type="learned_absolute", max_sequence_length=16)
    reference = state is None
    if reference:
        state = _draw_state(model)
    _load(model, lay, state, tp_rank)

    method = load_method(method_name)
    shard = shard_for_group(batch, dp_group)
    micros = shard.split(micro_batch_size)
    spec = VocabParallelLogits(tp_group, VOCAB, TEMPERATURE, sequence_first=sequence_first)
    schedule = get_forward_backward_func()
    forward_step = _forward_step(model, sequence_first)

    def run(fns, forward_only: bool) -> list[dict]:
        items = iter([(m.input_ids, fn) for m, fn in zip(micros, fns, strict=True)])
        return schedule(
            forward_step_func=forward_step,
            data_iterator=items,
            model=model,
            num_microbatches=len(micros),
            seq_length=shard.input_ids.shape[1],
            micro_batch_size=micro_batch_size,
            forward_only=forward_only,
        )

    with torch.no_grad():
        stats = run([stats_function(per_position(m.targets), spec) for m in micros], True)
    chunks = [
        TokenChunk(
            logprob=s["logprob"][:, :-1],
            entropy=s["entropy"][:, :-1],
            advantages=m.advantages,
            mask=m.response_mask,
            token_ids=m.token_ids,
        )
        for m, s in zip(micros, stats, strict=True)
    ]
    prepared = prepare(method, chunks, DataParallelReducer(dp_group))
    scaling = MegatronScaling(len(micros), dp)
    model.zero_grad(set_to_none=True)
    losses = run(
        [
            loss_function(method, loss_micro_batch(m, c), prepared.n_tokens, scaling, spec)
            for m, c in zip(micros, prepared.coefficients, strict=True)
        ],
        False,
    )
    # Megatron's DistributedDataParallel (0.16.1 distributed_data_parallel.py, not CPU-capable):
    # gradients scaled by 1 / dp_size, then summed over the data-parallel group.
    for param in model.parameters():
        param.grad /= dp
        dist.all_reduce(param.grad, group=dp_group)
    grads = _full_grads(model, lay, tp_group)

    rows = {}
    first = shard_rows(batch.rows, dp, dp_rank).start
    for m, s, loss in zip(micros, stats, losses, strict=True):
        for i in range(m.rows):
            keep = m.response_mask[i]
            rows[first + i] = (s["logprob"][i, :-1][keep], loss["logprob"][i, :-1][keep])
        first += m.rows
    if tp_rank == 0:
        torch.save(rows, out / f"rows_dp{dp_rank}.pt")
    if dist.get_rank() == 0:
        torch.save({"grads": grads, "n_tokens": prepared.n_tokens}, out / "grads.pt")
    if reference:
        torch.save(state, out / "state.pt")
    if reference and method_name == "opefo":
        weight = torch.cat([c.weight for c in prepared.coefficients])
        independent = _independent_grads(model, shard, weight, prepared.n_tokens)
        for name, grad in independent.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
