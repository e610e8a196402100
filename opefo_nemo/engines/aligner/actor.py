"""The NeMo shell of the ``aligner`` engine: NeMo's ``MegatronGPTModel`` restored from a NeMo
checkpoint with NeMo-Aligner 0.7.0's utilities, handed to ``MegatronPolicy``. The only module of
the package that imports NeMo, and none of NeMo-Aligner's TensorRT-LLM code. Only runs on CUDA
(docs/megatron.md, "The NeMo actor"; tests/gpu/README.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import cast

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel
from nemo.collections.nlp.models.language_modeling.megatron_gpt_model import (  # type: ignore[import-not-found]  # NeMo: in the training image only
    MegatronGPTModel,
)
from nemo.collections.nlp.parts.megatron_trainer_builder import (  # type: ignore[import-not-found]  # NeMo: in the training image only
    MegatronTrainerBuilder,
)
from nemo_aligner.models.alignable_interface import (  # type: ignore[import-not-found]  # NeMo-Aligner: in the training image only
    AlignableGenerativeInterface,
)
from nemo_aligner.utils.train_script_utils import (  # type: ignore[import-not-found]  # NeMo-Aligner: in the training image only
    init_distributed,
)
from nemo_aligner.utils.train_utils import (  # type: ignore[import-not-found]  # NeMo-Aligner: in the training image only
    set_eval,
    set_train,
)
from nemo_aligner.utils.utils import (  # type: ignore[import-not-found]  # NeMo-Aligner: in the training image only
    configure_batch_sizes,
    load_and_override_model_config,
    load_from_nemo,
)
from omegaconf import OmegaConf

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.aligner.availability import AlignerUnavailableError
from opefo_nemo.engines.aligner.nemo_config import (
    architecture_mismatches,
    data_parallel_size,
    find_nemo_checkpoint,
    model_overrides,
    trainer_settings,
)
from opefo_nemo.engines.megatron.build import wrap_for_training
from opefo_nemo.engines.megatron.policy import MegatronPolicy
from opefo_nemo.models.megatron_weights.layout import MegatronLayout


class OpefoActorModel(MegatronGPTModel, AlignableGenerativeInterface):
    """NeMo's GPT model as a NeMo-Aligner actor whose rollouts come from vLLM.

    opefo's trainer drives :class:`~.policy.MegatronPolicy`, which runs megatron's schedule on
    ``self.model`` itself and reduces the gradients over DP itself. So the hooks do only what
    that leaves to NeMo (the micro-batch calculator, train/eval mode) and never NeMo-Aligner's
    ``grad_reductions`` (a second DP all-reduce); the interface's two data-carrying calls refuse
    with the reason instead of computing something else.
    """

    def __init__(self, cfg, trainer) -> None:
        super().__init__(cfg, trainer=trainer)
        self.automatic_optimization = False

    def prepare_for_training(self) -> None:
        configure_batch_sizes(
            mbs=self.cfg.micro_batch_size,
            gbs=self.cfg.global_batch_size,
            dp=parallel_state.get_data_parallel_world_size(),
        )

    def finish_training(self) -> None:
        """Nothing to offload: the optimizer states stay on the GPU."""

    def prepare_for_training_step(self) -> None:
        set_train(self)

    def finish_training_step(self) -> None:
        """Nothing: ``MegatronPolicy.train_step`` reduces, clips and steps."""

    def prepare_for_inference(self) -> None:
        set_eval(self)

    def finish_inference(self) -> None:
        set_train(self)

    def get_loss_and_metrics(self, batch, forward_only):
        raise NotImplementedError(
            "OpefoActorModel.get_loss_and_metrics: the OPEFO loss is computed by "
            "MegatronPolicy.train_step through megatron's schedule (engines/megatron/policy.py)"
        )

    def infer(self, *args, **kwargs):
        raise NotImplementedError(
            "OpefoActorModel.infer: rollouts come from the vLLM servers (opefo_nemo.rollout), "
            "not from NeMo's generation"
        )


def _world() -> tuple[int, int]:
    """``(devices per node, nodes)`` of this job, from torchrun's or Slurm's environment."""
    world = int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)
    local = int(
        os.environ.get("LOCAL_WORLD_SIZE")
        or os.environ.get("SLURM_NTASKS_PER_NODE")
        or torch.cuda.device_count()
        or 1
    )
    if world % local:
        raise ValueError(f"world size {world} is not a multiple of {local} processes per node")
    return local, world // local


def restore_actor(checkpoint: Path, engine: MegatronEngineConfig, *, lr: float) -> OpefoActorModel:
    """NeMo's model restored from ``checkpoint`` under ``engine``'s layout, with
    ``torch.distributed``, ``parallel_state`` and Transformer Engine's TP groups initialised
    (NeMo-Aligner's ``load_and_override_model_config`` with
    :func:`~.nemo_config.model_overrides`, ``MegatronTrainerBuilder``, ``load_from_nemo``,
    ``init_distributed``; Lightning's fit set-up, which would build NeMo's optimizer, is
    skipped)."""
    devices, nodes = _world()
    overrides = model_overrides(
        engine, lr=lr, data_parallel=data_parallel_size(engine, devices * nodes)
    )
    model_cfg = load_and_override_model_config(str(checkpoint), OmegaConf.create(overrides))
    cfg = OmegaConf.create(
        {"trainer": trainer_settings(engine, devices=devices, num_nodes=nodes), "model": model_cfg}
    )
    trainer = MegatronTrainerBuilder(cfg).create_trainer()
    model = load_from_nemo(
        OpefoActorModel, cfg.model, trainer, strict=True, restore_path=str(checkpoint)
    )
    init_distributed(trainer, model, engine.transformer_engine)
    model.prepare_for_training()
    return model


def model_chunk(actor: OpefoActorModel) -> torch.nn.Module:
    """The megatron-core ``GPTModel`` inside NeMo's wrappers (no virtual pipeline stages)."""
    module = actor.model
    if isinstance(module, list):
        if len(module) != 1:
            raise ValueError(f"{len(module)} model chunks: virtual pipeline stages unsupported")
        module = module[0]
    while hasattr(module, "module"):  # megatron DDP, NeMo's / megatron's Float16Module
        module = module.module
    return module


def build_nemo_actor(
    model_dir: str | Path, engine: MegatronEngineConfig, *, lr: float, temperature: float
) -> MegatronPolicy:
    """The ``aligner`` engine's ``Policy`` for the model at ``model_dir`` (a Hugging Face
    directory holding the NeMo checkpoint, :func:`~.nemo_config.find_nemo_checkpoint`)."""
    hf_config = json.loads((Path(model_dir) / "config.json").read_text())
    layout = MegatronLayout.from_hf_config(
        hf_config,
        tensor_parallel=engine.tensor_model_parallel_size,
        pipeline_parallel=engine.pipeline_model_parallel_size,
        make_vocab_size_divisible_by=engine.make_vocab_size_divisible_by,
        fused_layernorm=engine.transformer_engine,
    )
    if layout.shape.qk_norm:
        raise AlignerUnavailableError(
            f"engine.name=aligner: {model_dir} has q/k norms (Qwen3); NeMo 2.2's MegatronGPTModel "
            "builds its layers without them (get_specs passes no qk_layernorm)"
        )
    checkpoint = find_nemo_checkpoint(model_dir, engine.nemo_checkpoint)
    actor = restore_actor(checkpoint, engine, lr=lr)
    mismatches = architecture_mismatches(actor.cfg, hf_config)
    if mismatches:
        raise AlignerUnavailableError(
            f"engine.name=aligner: the NeMo checkpoint in {model_dir} is not the model of its "
            f"config.json, which vLLM samples from: {'; '.join(mismatches)}"
        )
    chunk = cast(
        "GPTModel", model_chunk(actor).cuda(torch.cuda.current_device())
    )  # NeMo's core model
    return wrap_for_training(chunk, layout, engine, lr=lr, temperature=temperature)
