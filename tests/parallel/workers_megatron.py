"""Rank function: megatron-core's ColumnParallelLinear (parallel_output) → token_stats → OPEFO and
entropy-regularised losses → backward at TP = 2, against TP = 1 with the same full weight."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from opefo_nemo.core.objectives import (
    TokenChunk,
    build_objective,
    method_config,
    policy_loss,
    prepare,
)
from opefo_nemo.core.reduction import SingleProcessReducer
from opefo_nemo.parallel import token_stats
from tests.metric_bounds import assert_close_to_scale

HIDDEN, VOCAB, PADDED, SEQ, BATCH = 16, 50, 56, 6, 4  # Megatron pads 50 to a multiple of 4 × TP
TEMPERATURE = 0.9
OPEFO = {"name": "opefo", "entropy_flow": {"balance": "adaptive"}}
ENTROPY_REG = {"name": "entropy_reg", "entropy_coef": 0.01}


def _losses(logits: torch.Tensor, batch: dict[str, torch.Tensor], group) -> torch.Tensor:
    """OPEFO loss + entropy_reg loss of ``logits`` ``[batch, seq, V(/TP)]`` (spec §5)."""
    stats = token_stats(
        logits, batch["targets"], temperature=TEMPERATURE, group=group, vocab_size=VOCAB
    )
    total = torch.zeros(())
    for spec in (OPEFO, ENTROPY_REG):
        config = build_objective(method_config(spec))
        chunk = TokenChunk(
            logprob=stats.logprob.detach(),
            entropy=stats.entropy.detach(),
            advantages=batch["advantages"],
            mask=batch["mask"],
        )
        prepared = prepare(config, [chunk], SingleProcessReducer())
        entropy = stats.entropy if spec is ENTROPY_REG else None
        out = policy_loss(
            config,
            stats.logprob,
            batch["advantages"],
            batch["mask"],
            prepared.coefficients[0],
            prepared.n_tokens,
            entropy=entropy,
        )
        total = total + out.loss
    return total


def column_parallel_grads_match(rank: int, world_size: int) -> None:
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=2, create_gloo_process_groups=False
    )
    try:
        group = parallel_state.get_tensor_model_parallel_group()
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(PADDED, HIDDEN, generator=gen) * 0.5
        hidden = torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
        batch = {
            "targets": torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen),
            "advantages": (torch.randn(BATCH, generator=gen))[:, None].expand(BATCH, SEQ),
            "mask": torch.rand(BATCH, SEQ, generator=gen) > 0.2,
        }

        config = ModelParallelConfig(tensor_model_parallel_size=2, use_cpu_initialization=True)
        layer = ColumnParallelLinear(
            HIDDEN,
            PADDED,
            config=config,
            init_method=torch.nn.init.zeros_,
            bias=False,
            gather_output=False,
        )
        width = PADDED // 2
        with torch.no_grad():
            layer.weight.copy_(weight[tp_rank * width : (tp_rank + 1) * width])
        x = hidden.clone().requires_grad_()
        local_logits, _ = layer(x)  # [seq, batch, V/TP]
        _losses(local_logits.transpose(0, 1), batch, group).backward()
        shards = [torch.empty_like(layer.weight.grad) for _ in range(2)]
        dist.all_gather(shards, layer.weight.grad.contiguous(), group=group)

        full_weight = weight.clone().requires_grad_()
        x_ref = hidden.clone().requires_grad_()
        _losses((x_ref @ full_weight.T).transpose(0, 1), batch, None).backward()
        # fp32 sums in other orders, relative to each gradient's largest magnitude
        assert_close_to_scale(torch.cat(shards), full_weight.grad, 1e-5, "weight gradient")
        assert_close_to_scale(x.grad, x_ref.grad, 1e-5, "input gradient")
        assert full_weight.grad[VOCAB:].abs().max() == 0  # padded rows: no gradient
        assert full_weight.grad[:VOCAB].abs().max() > 1e-3  # the check is not vacuous
    finally:
        parallel_state.destroy_model_parallel()
