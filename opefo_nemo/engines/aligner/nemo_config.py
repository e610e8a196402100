"""What the NeMo actor (:mod:`.actor`) asks of NeMo, decided without importing NeMo: where its
checkpoint is, the model config and trainer section it is restored with, and where the restored
model differs from the Hugging Face config vLLM samples with. Key names are NeMo 2.2's (the NeMo
25.02 container; docs/megatron.md, "The NeMo actor").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opefo_nemo.config.engines import MegatronEngineConfig

#: Where the actor looks for the NeMo checkpoint, inside ``model.path`` (first found wins): a
#: ``.nemo`` tarball (NeMo 1 converters) or a NeMo 2 checkpoint directory (``nemo llm import``).
NEMO_CHECKPOINT_NAMES = ("model.nemo", "nemo")

#: NeMo's name for each ``engine.dtype``: (trainer precision, ``megatron_amp_O2``).
#: ``megatron_amp_O2`` keeps the model's parameters in bf16 with fp32 main weights in the
#: optimizer; at float32 there is nothing to keep apart.
PRECISION = {"bfloat16": ("bf16-mixed", True), "float32": (32, False)}


def find_nemo_checkpoint(model_dir: str | Path, explicit: str | None = None) -> Path:
    """The NeMo checkpoint to restore: ``explicit`` (``engine.nemo_checkpoint``) when given,
    else the first of :data:`NEMO_CHECKPOINT_NAMES` inside ``model_dir``.

    Raises ``FileNotFoundError`` naming the places looked at and the converter to run.
    """
    if explicit is not None:
        if not Path(explicit).exists():
            raise FileNotFoundError(f"engine.nemo_checkpoint={explicit} does not exist")
        return Path(explicit)
    base = Path(model_dir)
    for name in NEMO_CHECKPOINT_NAMES:
        candidate = base / name
        if candidate.exists():
            return candidate
    looked = " or ".join(str(base / name) for name in NEMO_CHECKPOINT_NAMES)
    raise FileNotFoundError(
        f"engine.name=aligner restores NeMo's model from {looked}; neither exists. Convert the "
        "Hugging Face checkpoint first (docs/megatron.md, 'The NeMo actor': nemo llm import)"
    )


def data_parallel_size(engine: MegatronEngineConfig, world_size: int) -> int:
    """``world_size / (TP × PP)``; an error naming the keys if it does not divide."""
    model_parallel = engine.tensor_model_parallel_size * engine.pipeline_model_parallel_size
    if world_size < 1 or world_size % model_parallel:
        raise ValueError(
            f"world size {world_size} is not a multiple of engine.tensor_model_parallel_size × "
            f"engine.pipeline_model_parallel_size = {model_parallel}"
        )
    return world_size // model_parallel


def model_overrides(
    engine: MegatronEngineConfig, *, lr: float, data_parallel: int
) -> dict[str, Any]:
    """NeMo model config keys for ``engine``, merged over the checkpoint's own model config
    (NeMo-Aligner's ``load_and_override_model_config``); ``megatron_base_model.py`` /
    ``megatron_gpt_model.py`` read them with ``cfg.get``.

    ``global_batch_size`` is one micro-batch per data-parallel rank: NeMo needs a value for its
    micro-batch calculator at start-up, while :class:`~.policy.MegatronPolicy` passes the real
    number of micro-batches to megatron's schedule on every call. ``optim`` is plain ``adamw``
    so that NeMo wraps the model in no data-parallel wrapper of its own; NeMo's optimizer is
    never built (the actor skips Lightning's fit set-up): megatron's DDP and optimizer come from
    the engine (:func:`~opefo_nemo.engines.megatron.build.wrap_for_training`).
    """
    recompute = (
        {
            "activations_checkpoint_granularity": "full",
            "activations_checkpoint_method": "uniform",
            "activations_checkpoint_num_layers": 1,
        }
        if engine.recompute_activations
        else {
            "activations_checkpoint_granularity": None,
            "activations_checkpoint_method": None,
        }
    )
    _, amp_o2 = PRECISION[engine.dtype]
    return {
        "mcore_gpt": True,
        "precision": PRECISION[engine.dtype][0],
        "megatron_amp_O2": amp_o2,
        "tensor_model_parallel_size": engine.tensor_model_parallel_size,
        "pipeline_model_parallel_size": engine.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": None,
        "context_parallel_size": 1,
        "sequence_parallel": engine.sequence_parallel,
        "transformer_engine": engine.transformer_engine,
        "make_vocab_size_divisible_by": engine.make_vocab_size_divisible_by,
        "micro_batch_size": engine.micro_batch_size,
        "global_batch_size": engine.micro_batch_size * data_parallel,
        **recompute,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "ffn_dropout": 0.0,
        "data": {"data_cache_generation_only": False},
        "optim": {"name": "adamw", "lr": lr},
    }


def trainer_settings(
    engine: MegatronEngineConfig, *, devices: int, num_nodes: int
) -> dict[str, Any]:
    """The ``trainer`` section for NeMo's ``MegatronTrainerBuilder`` (precision, devices, nodes,
    gradient clipping; one process per GPU,
    launched by Slurm/torchrun; no Lightning logging or checkpointing: ours does both)."""
    return {
        "devices": devices,
        "num_nodes": num_nodes,
        "accelerator": "gpu",
        "precision": PRECISION[engine.dtype][0],
        "max_steps": -1,
        "logger": False,
        "enable_checkpointing": False,
        "use_distributed_sampler": False,
        "enable_progress_bar": False,
        "gradient_clip_val": engine.grad_clip,
    }


#: NeMo model-config key → (Hugging Face ``config.json`` key, NeMo's default when the key is
#: absent, HF's default when absent). The rollout engine builds its model from ``config.json``.
ARCHITECTURE_KEYS = {
    "num_layers": ("num_hidden_layers", None, None),
    "hidden_size": ("hidden_size", None, None),
    "ffn_hidden_size": ("intermediate_size", None, None),
    "num_attention_heads": ("num_attention_heads", None, None),
    "num_query_groups": ("num_key_value_heads", None, None),
    "layernorm_epsilon": ("rms_norm_eps", 1e-5, 1e-6),
    "rotary_base": ("rope_theta", 10000, 10000),
    "share_embeddings_and_output_weights": ("tie_word_embeddings", True, False),
}


def architecture_mismatches(
    model_cfg: Mapping[str, Any], hf_config: Mapping[str, Any]
) -> list[str]:
    """The keys where the NeMo model config ``model_cfg`` and the Hugging Face ``hf_config``
    describe different models, as ``"key: NeMo value vs config.json value"`` (empty: the same).

    A model trained with another norm ε or rope base than vLLM's would be sampled off-policy
    without any error, so the actor refuses such a pair. ``num_query_groups`` absent (``None``)
    means one group per head.
    """
    problems = []
    for nemo_key, (hf_key, nemo_default, hf_default) in ARCHITECTURE_KEYS.items():
        ours = model_cfg.get(nemo_key, nemo_default)
        theirs = hf_config.get(hf_key, hf_default)
        if nemo_key == "num_query_groups" and ours is None:
            ours = model_cfg.get("num_attention_heads")
        if theirs is None and hf_key == "num_key_value_heads":
            theirs = hf_config.get("num_attention_heads")
        if isinstance(theirs, float) or isinstance(ours, float):
            same = ours is not None and theirs is not None and float(ours) == float(theirs)
        else:
            same = ours == theirs
        if not same:
            problems.append(f"{nemo_key}: {ours!r} vs config.json {hf_key}: {theirs!r}")
    return problems
