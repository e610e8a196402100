"""How a Megatron GPT model of a given shape is laid out across tensor and pipeline ranks: what
Megatron decides on top of :class:`opefo_nemo.launch.ModelShape` (docs/megatron.md, "Weight
mapping").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opefo_nemo.models.shape import ModelShape, check_positive_ints, padded_vocab_size


@dataclass(frozen=True)
class MegatronLayout:
    """A model shape placed on ``tensor_parallel × pipeline_parallel`` ranks (one replica): the
    vocabulary padded to a multiple of ``make_vocab_size_divisible_by × TP`` (spec §1), so the
    embedding and output layer split into equal slices; each stage's global decoder layers,
    ``L / PP`` each or Megatron's uneven split with ``first_stage_layers`` /
    ``last_stage_layers`` and the rest spread evenly over the middle stages; and whether the norms
    carry Transformer Engine's fused names (``linear_qkv.layer_norm_weight``,
    ``linear_fc1.layer_norm_weight``) or the local spec's (``input_layernorm``,
    ``pre_mlp_layernorm``): ``fused_layernorm``."""

    shape: ModelShape
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    make_vocab_size_divisible_by: int = 128
    fused_layernorm: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    def __post_init__(self) -> None:
        check_positive_ints(
            self, ("tensor_parallel", "pipeline_parallel", "make_vocab_size_divisible_by")
        )
        tp, shape = self.tensor_parallel, self.shape
        for name, count in (
            ("num_attention_heads", shape.num_attention_heads),
            ("intermediate_size", shape.intermediate_size),
        ):
            if count % tp:
                raise ValueError(
                    f"{name} = {count} is not divisible by tensor parallel {tp}: Megatron "
                    "splits it evenly across the tensor-parallel ranks"
                )
        groups = shape.num_key_value_heads
        if groups % tp and tp % groups:
            raise ValueError(
                f"num_key_value_heads = {groups} and tensor parallel {tp}: one must divide the "
                "other (Megatron splits whole key/value groups, or each group over TP / G ranks)"
            )
        if shape.num_attention_heads % groups:
            raise ValueError(
                f"num_attention_heads = {shape.num_attention_heads} is not a multiple of "
                f"num_key_value_heads = {groups}"
            )
        self._stage_sizes()

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], **settings: Any) -> MegatronLayout:
        """From a Hugging Face ``config.json`` mapping (Qwen2, Qwen3, Llama) and layout settings.

        Raises ``ValueError`` for a config this mapping cannot represent exactly (an MLP bias).
        """
        if config.get("mlp_bias"):
            raise ValueError("mlp_bias = true: the weight mapping has no MLP biases")
        return cls(ModelShape.from_hf_config(config), **settings)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of Megatron's embedding and output layer: the vocabulary padded (spec §1)."""
        return padded_vocab_size(
            self.shape.vocab_size, self.make_vocab_size_divisible_by, self.tensor_parallel
        )

    @property
    def queries_per_group(self) -> int:
        """Query heads that share one key/value head (``H / G``)."""
        return self.shape.num_attention_heads // self.shape.num_key_value_heads

    def _stage_sizes(self) -> tuple[int, ...]:
        """Decoder layers built by each pipeline stage; raises if they cannot be split so."""
        layers, stages = self.shape.num_layers, self.pipeline_parallel
        first, last = self.first_stage_layers, self.last_stage_layers
        if stages == 1:
            if first is not None or last is not None:
                raise ValueError("first/last_stage_layers need pipeline_parallel > 1")
            return (layers,)
        fixed = [count for count in (first, last) if count is not None]
        if any(not isinstance(count, int) or count < 0 for count in fixed):
            raise ValueError(f"first/last_stage_layers must be non-negative integers, got {fixed}")
        middle_stages = stages - len(fixed)
        middle_layers = layers - sum(fixed)
        if middle_layers < 0 or (middle_stages and middle_layers % middle_stages):
            raise ValueError(
                f"{layers} layers cannot be split over {stages} pipeline stages with "
                f"first_stage_layers = {first}, last_stage_layers = {last}: the remaining "
                f"{middle_layers} layers must divide evenly over {middle_stages} stages"
            )
        if not middle_stages and middle_layers:
            raise ValueError(
                f"first_stage_layers + last_stage_layers = {sum(fixed)} != {layers} layers"
            )
        each = middle_layers // middle_stages if middle_stages else 0
        sizes = [each] * stages
        if first is not None:
            sizes[0] = first
        if last is not None:
            sizes[-1] = last
        return tuple(sizes)

    def stage_layers(self, stage: int) -> range:
        """Global indices of the decoder layers of pipeline ``stage``.

        Stage ``s`` holds its layers under local indices ``0 … n_s − 1``; global index =
        local index + ``sum(n_0 … n_{s−1})`` (Megatron's layer offset).
        """
        if not 0 <= stage < self.pipeline_parallel:
            raise ValueError(f"pipeline stage {stage} is outside 0 … {self.pipeline_parallel - 1}")
        sizes = self._stage_sizes()
        offset = sum(sizes[:stage])
        return range(offset, offset + sizes[stage])

    def stage_of_layer(self, layer: int) -> int:
        """The pipeline stage that holds global decoder ``layer``."""
        for stage in range(self.pipeline_parallel):
            if layer in self.stage_layers(stage):
                return stage
        raise ValueError(f"decoder layer {layer} is outside 0 … {self.shape.num_layers - 1}")
