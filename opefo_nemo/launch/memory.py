"""Per-GPU memory estimate of one training rank (Megatron layout) and of its colocated vLLM, in
bytes on the most loaded pipeline stage; each formula sits at the function computing it
(:func:`estimate_memory`). How ``opefo-preflight`` reports it: docs/cluster.md, section 7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opefo_nemo.kernels.budgets import GRAD_BLOCKS_V, fused_backward_bytes
from opefo_nemo.launch.layout import ParallelLayout
from opefo_nemo.models.shape import ModelShape, check_positive_ints, padded_vocab_size

GIB = 1024**3


@dataclass(frozen=True)
class MemorySettings:
    """What besides the model shape and the layout decides memory. ``max_tokens_per_micro_batch``
    (``engine.max_tokens_per_micro_batch``; ``None``: ``micro_batch_size`` rows): the padded
    tokens of the widest micro-batch a token budget allows."""

    sequence_length: int
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    max_tokens_per_micro_batch: int | None = None
    param_bytes: int = 2
    grad_bytes: int = 4
    activation_bytes: int = 2
    optimizer_bytes: int = 12
    distributed_optimizer: bool = True
    activation_recompute: bool = False
    make_vocab_size_divisible_by: int = 128
    fused_output_layer: bool = False
    entropy_correction: bool = False
    vllm_memory_fraction: float = 0.0
    vllm_asleep_bytes: int = 0
    overhead_bytes: int = 0

    def __post_init__(self) -> None:
        check_positive_ints(
            self,
            (
                "sequence_length",
                "micro_batch_size",
                "num_micro_batches",
                "param_bytes",
                "grad_bytes",
                "activation_bytes",
                "optimizer_bytes",
                "make_vocab_size_divisible_by",
            ),
        )
        budget = self.max_tokens_per_micro_batch
        if budget is not None and (not isinstance(budget, int) or budget <= 0):
            raise ValueError(
                f"MemorySettings.max_tokens_per_micro_batch must be a positive integer or None, "
                f"got {budget!r}"
            )
        if not 0.0 <= self.vllm_memory_fraction < 1.0:
            raise ValueError(
                f"MemorySettings.vllm_memory_fraction must be in [0, 1), got "
                f"{self.vllm_memory_fraction!r}"
            )
        for name in ("vllm_asleep_bytes", "overhead_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"MemorySettings.{name} must be >= 0")


def parameters_per_rank(shape: ModelShape, layout: ParallelLayout, divisible_by: int) -> int:
    """``P``, the parameters held by one rank of the most loaded pipeline stage: its 1/TP slice of
    the split matrices, the whole norms, the embedding on the first stage, the output layer on
    the last; the vocabulary padded to a multiple of ``make_vocab_size_divisible_by × TP``.

    With PP > 1 the first stage holds the embedding and the last the output layer (a copy of the
    embedding when tied); with PP = 1 one stage holds both (one matrix when tied).
    """
    tp, pp = layout.tensor, layout.pipeline
    vocab = padded_vocab_size(shape.vocab_size, divisible_by, tp)
    layers = math.ceil(shape.num_layers / pp)
    per_layer = (
        shape.attention_parameters() + shape.mlp_parameters()
    ) // tp + shape.replicated_layer_parameters()
    embedding = shape.embedding_parameters(vocab) // tp
    body = layers * per_layer
    if pp == 1:
        output = 0 if shape.tie_word_embeddings else embedding
        return body + embedding + output + shape.hidden_size
    first = body + embedding
    last = body + embedding + shape.hidden_size
    return max(first, last)


def activation_bytes_per_token_layer(
    shape: ModelShape, layout: ParallelLayout, settings: MemorySettings
) -> float:
    """Bytes one decoder layer keeps for backward per token on one rank, ``a = activation_bytes``,
    ``s = TP`` with sequence parallel, else 1:

    - no recomputation: ``a · (4h / s + (2·H·d + 2·G·d + 3f) / TP) + 4 · H / TP``; 4h: the inputs
      of both norms and of the QKV and MLP input projections; Q, K, V and the attention output;
      the gated MLP's two input projections (2f) and its down projection's input (f); fp32
      softmax statistics (flash attention keeps no s×s matrix);
    - full recomputation: ``a · h / s`` (only each layer's input)."""
    tp = layout.tensor
    split = tp if layout.sequence_parallel else 1
    a = settings.activation_bytes
    if settings.activation_recompute:
        return a * shape.hidden_size / split
    replicated = 4 * shape.hidden_size / split
    sharded = (2 * shape.query_width + 2 * shape.key_value_width + 3 * shape.intermediate_size) / tp
    return a * (replicated + sharded) + 4 * shape.num_attention_heads / tp


@dataclass(frozen=True)
class MemoryEstimate:
    """The per-GPU table, in bytes; ``optimizer`` follows ``settings.distributed_optimizer``."""

    weights: int
    gradients: int
    optimizer_plain: int
    optimizer_distributed: int
    activations: int
    logits: int
    vllm_share: int
    vllm_asleep: int
    overhead: int
    distributed_optimizer: bool
    fused_output_layer: bool = False
    entropy_gradient: int = 0

    @property
    def optimizer(self) -> int:
        """Optimizer states under the configured optimizer."""
        return self.optimizer_distributed if self.distributed_optimizer else self.optimizer_plain

    @property
    def resident(self) -> int:
        """What the actor keeps on the GPU in both phases: weights, gradients, optimizer."""
        return self.weights + self.gradients + self.optimizer

    @property
    def training(self) -> int:
        """The training phase's total: resident + activations + logits + the entropy gradient
        + asleep vLLM + overhead."""
        return (
            self.resident
            + self.activations
            + self.logits
            + self.entropy_gradient
            + self.vllm_asleep
            + self.overhead
        )

    @property
    def generation(self) -> int:
        """The rollout phase's total: resident + vLLM's share of the GPU + overhead."""
        return self.resident + self.vllm_share + self.overhead

    @property
    def peak(self) -> int:
        """The larger of the two phases."""
        return max(self.training, self.generation)


def estimate_memory(
    shape: ModelShape,
    layout: ParallelLayout,
    settings: MemorySettings,
    gpu_memory_bytes: int = 0,
) -> MemoryEstimate:
    """The per-GPU estimate; ``gpu_memory_bytes`` sizes vLLM's share (0: none). With ``P`` =
    :func:`parameters_per_rank`::

        weights     = P · param_bytes
        gradients   = P · grad_bytes            (Megatron keeps fp32 main grads)
        optimizer   = P · optimizer_bytes       (12: Adam m, v and the fp32 master copy of mixed
                      [/ DP, distributed optimizer]   precision; 2·param_bytes without)
        activations = tokens · layers_per_stage · in_flight · per_token_layer
        logits      = output_layer_bytes(...)   (last stage)
        entropy gradient = P · grad_bytes       (a method that corrects its update,
                      [/ DP, distributed optimizer]   entropy_neutral: ∇θ H̄ kept in the
                                                optimizer's layout during the update)

    ``tokens = micro_batch_size · sequence_length``, or with a token budget
    ``max_tokens_per_micro_batch`` (every micro-batch's rows × padded width stays within it);
    ``in_flight`` = ``min(PP, micro-batches)``,
    the micro-batches whose activations the first stage holds under the 1F1B schedule;
    ``per_token_layer`` = :func:`activation_bytes_per_token_layer`. The colocated rollout engine
    uses ``vllm_memory_fraction`` of the GPU while it generates and ``vllm_asleep_bytes`` while
    the actor trains; the peak is the larger phase (:class:`MemoryEstimate`)."""
    params = parameters_per_rank(shape, layout, settings.make_vocab_size_divisible_by)
    optimizer = params * settings.optimizer_bytes
    tokens = settings.max_tokens_per_micro_batch or (
        settings.micro_batch_size * settings.sequence_length
    )
    layers = math.ceil(shape.num_layers / layout.pipeline)
    in_flight = min(layout.pipeline, settings.num_micro_batches)
    per_token_layer = activation_bytes_per_token_layer(shape, layout, settings)
    vocab = padded_vocab_size(
        shape.vocab_size, settings.make_vocab_size_divisible_by, layout.tensor
    )
    entropy_gradient = 0
    if settings.entropy_correction:
        shards = layout.data if settings.distributed_optimizer else 1
        entropy_gradient = math.ceil(params * settings.grad_bytes / shards)
    return MemoryEstimate(
        weights=params * settings.param_bytes,
        gradients=params * settings.grad_bytes,
        optimizer_plain=optimizer,
        optimizer_distributed=math.ceil(optimizer / layout.data),
        activations=math.ceil(tokens * layers * in_flight * per_token_layer),
        logits=output_layer_bytes(shape, layout, settings, tokens, vocab),
        vllm_share=int(settings.vllm_memory_fraction * gpu_memory_bytes),
        vllm_asleep=settings.vllm_asleep_bytes,
        overhead=settings.overhead_bytes,
        distributed_optimizer=settings.distributed_optimizer,
        fused_output_layer=settings.fused_output_layer,
        entropy_gradient=entropy_gradient,
    )


def output_layer_bytes(
    shape: ModelShape, layout: ParallelLayout, settings: MemorySettings, tokens: int, vocab: int
) -> int:
    """The last stage's statistics memory beyond the activations: the ``[tokens, V_pad/TP]`` logits
    and their fp32 copy, ``tokens · V_pad / TP · (activation_bytes + 4)``, or, with the output
    layer fused into the statistics, what its backward allocates
    (``kernels.budgets.fused_backward_bytes``: fp32 ``[tokens, h]`` accumulators, one vocabulary
    chunk's gradient, at most 64 MiB, and the output weight shard's gradient in
    ``activation_bytes``)."""
    shard = vocab // layout.tensor
    if settings.fused_output_layer:
        return fused_backward_bytes(
            tokens, shard, shape.hidden_size, settings.activation_bytes, GRAD_BLOCKS_V
        )
    return tokens * shard * (settings.activation_bytes + 4)
