"""The ``engine`` section of the trainer's configuration (``conf/engine/*.yaml``) as validated
dataclasses: ``hf`` (:class:`EngineConfig`) and the megatron-core engines ``megatron`` /
``aligner`` (:class:`MegatronEngineConfig`); ``engine.name`` picks one (:data:`ENGINE_CONFIGS`).
Every key is documented beside it in the YAML files; errors name the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.schema import one_of, require
from ..kernels import ENGINE_STATS_KERNELS, FUSED_LINEAR
from ..models.shape import ModelShape

DTYPES = ("float32", "bfloat16")
MEGATRON_DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class OptimizerConfig:
    """The schedule, AdamW and token-stats keys every engine shares (validated together)."""

    warmup_steps: int = 10
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    stats_chunk_tokens: int | None = None
    stats_kernel: str = "auto"


@dataclass(frozen=True)
class EngineConfig(OptimizerConfig):
    """``engine=hf`` (``conf/engine/hf.yaml``, every key documented there): one device."""

    name: str = "hf"
    device: str = "cpu"
    dtype: str = "float32"
    micro_batch_size: int = 16

    def validate(self) -> None:
        """The keys' ranges; errors name the key (``engine.<key>``)."""
        one_of(self.name, ("hf",), "engine.name")
        one_of(self.dtype, DTYPES, "engine.dtype")
        require(
            self.stats_kernel != FUSED_LINEAR,
            "engine.stats_kernel",
            f"={FUSED_LINEAR} is for engine=megatron or aligner (it replaces megatron-core's "
            "output layer); engine=hf takes auto, torch or triton",
        )
        _validate_optimizer(self)


@dataclass(frozen=True)
class MegatronEngineConfig(OptimizerConfig):
    """``engine=megatron`` and ``engine=aligner`` (``conf/engine/megatron.yaml``, every key
    documented there; ``aligner.yaml`` extends it): the megatron-core engine's layout, precision
    and optimizer, and the colocated rollout. ``megatron`` reads the Hugging Face checkpoint,
    ``aligner`` restores a NeMo checkpoint through the NeMo-Aligner actor."""

    name: str = "megatron"
    device: str = "cuda"
    dtype: str = "bfloat16"
    micro_batch_size: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    sequence_parallel: bool = False
    transformer_engine: bool = True
    recompute_activations: bool = False
    use_distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False
    make_vocab_size_divisible_by: int = 128
    rollout_tp_size: int = 1
    nemo_checkpoint: str | None = None

    def validate(self) -> None:
        """Ranges and contradictions between the keys; errors name the key (``engine.<key>``)."""
        one_of(self.name, ("megatron", "aligner"), "engine.name")
        one_of(self.device, MEGATRON_DEVICES, "engine.device")
        one_of(self.dtype, DTYPES, "engine.dtype")
        require(
            self.nemo_checkpoint is None or self.name == "aligner",
            "engine.nemo_checkpoint",
            "is set but engine.name=megatron reads the Hugging Face checkpoint at model.path; "
            "train a NeMo checkpoint with engine=aligner",
        )
        require(
            self.device == "cuda" or self.name == "megatron",
            "engine.device",
            "=cpu is for engine=megatron; the NeMo-Aligner actor's model classes need CUDA",
        )
        for key in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "make_vocab_size_divisible_by",
            "rollout_tp_size",
        ):
            require(getattr(self, key) >= 1, f"engine.{key}", "must be >= 1")
        require(
            not self.sequence_parallel or self.tensor_model_parallel_size > 1,
            "engine.sequence_parallel",
            "needs engine.tensor_model_parallel_size > 1 (it splits activations over the TP group)",
        )
        _validate_optimizer(self)

    def validate_model(self, shape: ModelShape, source: str) -> None:
        """The layout against the model read from ``source`` (its ``config.json``)."""
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        require(
            pp <= shape.num_layers and shape.num_layers % pp == 0,
            "engine.pipeline_model_parallel_size",
            f"({pp}) must divide the {shape.num_layers} decoder layers of {source}",
        )
        for what, count in (
            ("num_attention_heads", shape.num_attention_heads),
            ("intermediate_size", shape.intermediate_size),
        ):
            require(
                count % tp == 0,
                "engine.tensor_model_parallel_size",
                f"({tp}) must divide {what} = {count} of {source}",
            )
        groups = shape.num_key_value_heads
        require(
            groups % tp == 0 or tp % groups == 0,
            "engine.tensor_model_parallel_size",
            f"({tp}) and num_key_value_heads = {groups} of {source}: one must divide the other",
        )


def _validate_optimizer(e: EngineConfig | MegatronEngineConfig) -> None:
    """The schedule and AdamW keys both engines share."""
    require(e.micro_batch_size >= 1, "engine.micro_batch_size", "must be >= 1")
    require(e.warmup_steps >= 0, "engine.warmup_steps", "must be >= 0")
    require(e.grad_clip >= 0, "engine.grad_clip", "must be >= 0 (0 disables clipping)")
    require(
        e.stats_chunk_tokens is None or e.stats_chunk_tokens >= 1,
        "engine.stats_chunk_tokens",
        "must be >= 1 or null",
    )
    one_of(e.stats_kernel, ENGINE_STATS_KERNELS, "engine.stats_kernel")
    require(
        e.stats_kernel not in ("triton", FUSED_LINEAR) or e.device.startswith("cuda"),
        "engine.stats_kernel",
        f"={e.stats_kernel} needs engine.device=cuda, not {e.device} (auto picks torch there)",
    )


ENGINE_CONFIGS: dict[str, type] = {
    "hf": EngineConfig,
    "megatron": MegatronEngineConfig,
    "aligner": MegatronEngineConfig,
}
"""``engine.name`` → the dataclass its section is validated as."""
