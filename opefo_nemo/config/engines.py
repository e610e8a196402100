"""The ``engine`` section of the trainer's configuration (``conf/engine/*.yaml``) as validated
dataclasses: ``hf`` (:class:`EngineConfig`) and the megatron-core engines ``megatron`` /
``aligner`` (:class:`MegatronEngineConfig`); ``engine.name`` picks one (:data:`ENGINE_CONFIGS`).
Each field's default is the key's default, its docstring its meaning; errors name the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from opefo_nemo.core.schema import one_of, require
from opefo_nemo.kernels import ENGINE_STATS_KERNELS, FUSED_LINEAR
from opefo_nemo.models.shape import ModelShape

DTYPES = ("float32", "bfloat16")
ATTENTIONS = ("default", "eager", "sdpa")
MEGATRON_DEVICES = ("cuda", "cpu")
BALANCED, CONTIGUOUS = "balanced", "contiguous"
BATCH_LAYOUTS = (BALANCED, CONTIGUOUS)


@dataclass(frozen=True)
class OptimizerConfig:
    """The schedule, AdamW, token-stats and batch-layout keys every engine shares (validated
    together)."""

    warmup_steps: int = 10
    """Linear learning-rate warm-up over the first N rollout steps."""
    grad_clip: float = 1.0
    """Clip the global gradient norm (0: no clipping)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW β1."""
    adam_beta2: float = 0.999
    """AdamW β2."""
    adam_eps: float = 1e-8
    """AdamW ε."""
    stats_chunk_tokens: int | None = None
    """Tokens per token-stats chunk (null: fit 256 MiB of fp32 logits; with the triton kernel,
    which needs no buffer: all tokens)."""
    stats_kernel: str = "auto"
    """Token statistics: auto (triton on CUDA when it imports, else torch) | torch | triton
    (needs device=cuda) | fused_linear (megatron and aligner only: from the final hidden states
    and the output weight, the logits never stored; needs device=cuda); docs/kernels.md."""
    batch_layout: str = BALANCED
    """Which responses share a micro-batch and a data-parallel rank: balanced (sorted by length,
    the ranks' padded tokens balanced) | contiguous (consecutive responses, equal contiguous
    blocks of micro-batches per rank). The update is the same up to rounding (spec §11);
    docs/batch_layout.md."""
    max_tokens_per_micro_batch: int | None = None
    """null: micro-batches of micro_batch_size responses | N: micro-batches of as many
    responses as keep responses × the longest one's tokens (prompt included) within N, which
    must hold data.max_prompt_tokens + rollout.max_new_tokens (docs/batch_layout.md)."""

    @property
    def sequence_multiple(self) -> int:
        """What every micro-batch's width is rounded up to (1: none)."""
        return 1


@dataclass(frozen=True)
class EngineConfig(OptimizerConfig):
    """``engine=hf`` (``engines/hf.py``): a Hugging Face causal LM on one device (CPU or one GPU),
    AdamW, the schedule of spec §8."""

    name: str = "hf"
    """This engine, a Hugging Face causal LM on one device (``engines/hf.py``); megatron and
    aligner: megatron-core (``conf/engine/megatron.yaml``)."""
    device: str = "cpu"
    """cpu | cuda | cuda:N."""
    dtype: str = "float32"
    """float32 | bfloat16: mixed precision, forward, backward and ``rollout=engine``
    generation in bf16 with fp32 master weights, gradients and AdamW moments (the statistics
    are fp32 from the logits in both; docs/training.md, "Precision")."""
    micro_batch_size: int = 16
    """Responses per forward/backward; gradients accumulate over them."""
    shared_forward: bool = False
    """One forward per micro-batch for the token statistics and the loss of a strict on-policy
    step: the statistics pass keeps every micro-batch's graph until its backward, saving one
    forward of the batch (two of a corrected update's four) for the activations of the whole
    batch held at once (docs/training.md, "One forward for the statistics and the loss")."""
    attention: str = "default"
    """default (transformers' choice for the checkpoint, sdpa for most) | eager | sdpa: the
    attention of every forward. eager takes about a tenth off a bf16 step of short sequences on
    a CPU but holds each layer's rows × heads × tokens² weights (docs/performance.md)."""

    def validate(self) -> None:
        """The keys' ranges; errors name the key (``engine.<key>``)."""
        one_of(self.name, ("hf",), "engine.name")
        one_of(self.dtype, DTYPES, "engine.dtype")
        one_of(self.attention, ATTENTIONS, "engine.attention")
        require(
            self.stats_kernel != FUSED_LINEAR,
            "engine.stats_kernel",
            f"={FUSED_LINEAR} is for engine=megatron or aligner (it replaces megatron-core's "
            "output layer); engine=hf takes auto, torch or triton",
        )
        _validate_optimizer(self)


@dataclass(frozen=True)
class MegatronEngineConfig(OptimizerConfig):
    """``engine=megatron`` (``engines/megatron``): a megatron-core GPT model built from the Hugging
    Face ``config.json`` at ``model.path``, its safetensors streamed into this rank's TP/PP
    shards; megatron DDP and optimizer (docs/megatron.md). ``engine=aligner``
    (``conf/engine/aligner.yaml``) takes the same keys and restores a NeMo checkpoint through the
    NeMo-Aligner actor instead. The paper presets (``conf/preset/opefo_*.yaml``) set the layout."""

    name: str = "megatron"
    """megatron (reads the Hugging Face checkpoint at ``model.path``) | aligner (restores a
    NeMo checkpoint through the NeMo-Aligner actor; ``conf/engine/aligner.yaml``)."""
    device: str = "cuda"
    """cuda: one GPU per rank (NCCL) | cpu: CPU ranks over gloo, for tests and small models
    (docs/megatron.md, "CPU ranks")."""
    dtype: str = "bfloat16"
    """bfloat16 | float32: parameters and activations; Megatron keeps fp32 main gradients and
    fp32 master weights and Adam moments."""
    micro_batch_size: int = 1
    """Responses per forward/backward of one data-parallel rank; gradients accumulate over the
    micro-batches of the step."""
    tensor_model_parallel_size: int = 1
    """TP: each layer's weights and the vocabulary split over TP GPUs; must divide the attention
    heads and the MLP width, and divide or be a multiple of the key/value heads."""
    pipeline_model_parallel_size: int = 1
    """PP: the decoder layers split into PP stages of equal size; must divide the number of
    layers."""
    sequence_parallel: bool = False
    """Split LayerNorm/dropout activations along the sequence over the TP group (sequences padded
    to a multiple of TP); needs ``tensor_model_parallel_size`` > 1."""
    transformer_engine: bool = True
    """Transformer Engine's fused layers when it imports on a GPU rank; otherwise (false, not
    installed, device=cpu) megatron-core's local layer spec (the weight names differ,
    docs/megatron.md)."""
    recompute_activations: bool = False
    """Full activation recomputation: one extra forward per micro-batch instead of keeping the
    layers' activations."""
    use_distributed_optimizer: bool = True
    """Shard the fp32 master weights and Adam moments over the data-parallel ranks (ZeRO-1)."""
    overlap_grad_reduce: bool = False
    """Start each gradient bucket's data-parallel reduction during the backward of the last
    micro-batch instead of after it."""
    make_vocab_size_divisible_by: int = 128
    """Megatron pads the vocabulary to a multiple of this × TP; the padded columns are excluded
    from every statistic (spec §1)."""
    rollout_tp_size: int = 1
    """Tensor-parallel size of each colocated vLLM server: one server per ``rollout_tp_size``
    training GPUs (on the same node), asleep while the actor trains; its memory share is
    ``rollout.gpu_memory_utilization``."""
    nemo_checkpoint: str | None = None
    """engine=aligner only: the NeMo checkpoint to train (a .nemo file or a NeMo 2 directory);
    null: ``model.path/model.nemo``, else ``model.path/nemo/``."""

    @property
    def sequence_multiple(self) -> int:
        """Sequence parallelism splits each sequence over the TP ranks: widths are rounded up to
        a multiple of TP."""
        return self.tensor_model_parallel_size if self.sequence_parallel else 1

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
    one_of(e.batch_layout, BATCH_LAYOUTS, "engine.batch_layout")
    require(
        e.max_tokens_per_micro_batch is None or e.max_tokens_per_micro_batch >= 1,
        "engine.max_tokens_per_micro_batch",
        "must be >= 1 or null",
    )
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
