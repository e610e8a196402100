"""``engine=megatron``: the trainer's ``Policy`` from a Hugging Face checkpoint, on every rank:
parallel state, CPU redirections or CUDA RNG, this stage's ``GPTModel`` with its weights streamed
in, megatron's DDP and optimizer (docs/megatron.md, "Start-up of ``engine=megatron``").
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.engines.megatron.megatron_optimizer import build_megatron_optimizer, wrap_in_ddp
from opefo_nemo.engines.megatron.model_builder import build_gpt_model, uses_transformer_engine
from opefo_nemo.engines.megatron.policy import MegatronPolicy
from opefo_nemo.engines.startup import DeviceUnavailableError
from opefo_nemo.models.megatron_weights.hf_loading import load_stage_weights
from opefo_nemo.models.megatron_weights.layout import MegatronLayout

#: Seed of megatron's model-parallel RNG tracker (dropout is 0; the tracker must exist).
MODEL_PARALLEL_SEED = 1234

#: Process-lifetime CPU redirections of ``engine.device=cpu`` (entered once, never left).
_CPU_EXECUTION = ExitStack()


def layout_for(engine: MegatronEngineConfig, hf_config: dict) -> MegatronLayout:
    """The Megatron layout of the Hugging Face model under ``engine``'s settings."""
    return MegatronLayout.from_hf_config(
        hf_config,
        tensor_parallel=engine.tensor_model_parallel_size,
        pipeline_parallel=engine.pipeline_model_parallel_size,
        make_vocab_size_divisible_by=engine.make_vocab_size_divisible_by,
        fused_layernorm=uses_transformer_engine(engine),
    )


def initialize_parallel_state(engine: MegatronEngineConfig) -> None:
    """``parallel_state`` for the engine's TP × PP (DP = the rest of the world) with megatron's
    gloo data-parallel groups (the distributed optimizer asks for them); then, on
    ``engine.device=cpu``, megatron-core's CUDA calls pointed at the CPU for the rest of the
    process (:mod:`.cpu_execution`), on GPUs megatron's model-parallel RNG seeded. A second call
    with the same sizes keeps the groups, other sizes are an error."""
    tp, pp = engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if have != (tp, pp):
            raise RuntimeError(
                f"parallel_state is already initialised for TP × PP = {have}, not {(tp, pp)}"
            )
    else:
        compat.initialize_model_parallel(tp, pp, gloo_groups=True)
    if engine.device == "cpu":
        _CPU_EXECUTION.enter_context(megatron_on_cpu())
    else:
        _seed_cuda_model_parallel()


def _seed_cuda_model_parallel() -> None:  # pragma: no cover
    """CUDA only: megatron's model-parallel CUDA RNG states (the weight initialisation and
    dropout of each TP rank)."""
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(MODEL_PARALLEL_SEED)


def wrap_for_training(
    model: GPTModel,
    layout: MegatronLayout,
    engine: MegatronEngineConfig,
    *,
    lr: float,
    temperature: float,
) -> MegatronPolicy:
    """``model`` (this rank's megatron-core ``GPTModel``, weights loaded) in megatron's DDP with
    megatron's optimizer (:mod:`.megatron_optimizer`), as the trainer's ``Policy``; shared with
    the NeMo-Aligner actor, whose model comes from a NeMo checkpoint instead."""
    ddp = wrap_in_ddp(model, engine)
    optimizer = build_megatron_optimizer(ddp, engine, lr)
    return MegatronPolicy(ddp, optimizer, engine, layout=layout, temperature=temperature)


def build_megatron_policy(
    model_dir: str | Path, engine: MegatronEngineConfig, *, lr: float, temperature: float
) -> MegatronPolicy:
    """The trainer's ``Policy`` for the Hugging Face model at ``model_dir``, run by every rank
    after the default process group is joined (:class:`~opefo_nemo.orchestration.ranks.LoopRanks`):
    :func:`initialize_parallel_state`, this rank's pipeline stage of the ``GPTModel``
    (:func:`~.model_builder.build_gpt_model`) with its TP shard of the safetensors streamed in
    (:func:`~opefo_nemo.models.megatron_weights.hf_loading.load_stage_weights`), then
    :func:`wrap_for_training`."""
    if engine.device == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(
            "engine.device=cuda but this rank sees no GPU: run on GPU nodes, or set "
            "engine.device=cpu (CPU ranks over gloo, for small models)"
        )
    model_dir = Path(model_dir)
    hf_config = json.loads((model_dir / "config.json").read_text())
    layout = layout_for(engine, hf_config)
    initialize_parallel_state(engine)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    model = build_gpt_model(layout, engine, hf_config, stage, source=str(model_dir))
    if engine.device == "cuda":
        model = _on_current_cuda_device(model)
    load_stage_weights(
        model, layout, model_dir, stage, parallel_state.get_tensor_model_parallel_rank()
    )
    return wrap_for_training(model, layout, engine, lr=lr, temperature=temperature)


def _on_current_cuda_device(model: GPTModel) -> GPTModel:  # pragma: no cover
    """CUDA only: ``model`` moved to this rank's current GPU."""
    return model.cuda(torch.cuda.current_device())
