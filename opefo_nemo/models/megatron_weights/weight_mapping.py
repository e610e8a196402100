"""Megatron-core GPT ↔ Hugging Face (Qwen2, Qwen3, Llama) weight names and layouts: one
:class:`WeightSpec` per Megatron weight (its name on its pipeline stage, the Hugging Face tensors
it is made of, how they are fused, how tensor parallelism splits it). The table of names, the fused
QKV and gate/up layouts, vocabulary padding and tied embeddings: docs/megatron.md, "Weight mapping".
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from opefo_nemo.models.megatron_weights.layout import MegatronLayout


class Fusion(enum.Enum):
    """How the Hugging Face tensors of one Megatron weight are combined."""

    NONE = "none"  # one tensor as is
    QKV = "qkv"  # q, k, v interleaved per key/value group
    GATE_UP = "gate_up"  # gate and up stacked along rows
    VOCAB = "vocab"  # one tensor, rows padded to the padded vocabulary


class Sharding(enum.Enum):
    """How tensor parallelism splits one Megatron weight over ``TP`` ranks."""

    REPLICATED = "replicated"  # every rank holds all of it (norms)
    COLUMN = "column"  # contiguous row blocks (dim 0): QKV (whole groups), embedding, output
    GATED_COLUMN = (
        "gated_column"  # each half of [gate; up] in row blocks: rank r has [gate_r; up_r]
    )
    ROW = "row"  # contiguous column blocks (dim 1): linear_proj, linear_fc2


@dataclass(frozen=True)
class WeightSpec:
    """One Megatron weight: ``name`` on pipeline ``stage``, full (TP-gathered, padded) ``shape``.

    ``hf_names`` are the Hugging Face tensors it is fused from, in fusion order; ``tied_copy``
    marks the last stage's copy of a tied embedding (no Hugging Face name of its own).
    """

    name: str
    stage: int
    hf_names: tuple[str, ...]
    fusion: Fusion
    sharding: Sharding
    shape: tuple[int, ...]
    tied_copy: bool = False


def _layer_specs(layout: MegatronLayout, layer: int) -> list[WeightSpec]:
    """The weights of global decoder ``layer``, named as its pipeline stage holds them."""
    shape = layout.shape
    stage = layout.stage_of_layer(layer)
    local = layer - layout.stage_layers(stage).start
    meg, hf = f"decoder.layers.{local}.", f"model.layers.{layer}."
    h, d, f = shape.hidden_size, shape.head_dim, shape.intermediate_size
    qkv_rows = (shape.num_attention_heads + 2 * shape.num_key_value_heads) * d
    if layout.fused_layernorm:
        input_norm = "self_attention.linear_qkv.layer_norm_weight"
        pre_mlp_norm = "mlp.linear_fc1.layer_norm_weight"
    else:
        input_norm, pre_mlp_norm = "input_layernorm.weight", "pre_mlp_layernorm.weight"
    attention = f"{hf}self_attn."
    rows: list[tuple[str, tuple[str, ...], Fusion, Sharding, tuple[int, ...]]] = [
        (input_norm, (f"{hf}input_layernorm.weight",), Fusion.NONE, Sharding.REPLICATED, (h,)),
        (
            "self_attention.linear_qkv.weight",
            tuple(f"{attention}{p}_proj.weight" for p in "qkv"),
            Fusion.QKV,
            Sharding.COLUMN,
            (qkv_rows, h),
        ),
    ]
    if shape.qkv_bias:
        rows.append(
            (
                "self_attention.linear_qkv.bias",
                tuple(f"{attention}{p}_proj.bias" for p in "qkv"),
                Fusion.QKV,
                Sharding.COLUMN,
                (qkv_rows,),
            )
        )
    if shape.qk_norm:
        for side in "qk":
            rows.append(
                (
                    f"self_attention.{side}_layernorm.weight",
                    (f"{attention}{side}_norm.weight",),
                    Fusion.NONE,
                    Sharding.REPLICATED,
                    (d,),
                )
            )
    rows += [
        (
            "self_attention.linear_proj.weight",
            (f"{attention}o_proj.weight",),
            Fusion.NONE,
            Sharding.ROW,
            (h, shape.num_attention_heads * d),
        ),
        (
            pre_mlp_norm,
            (f"{hf}post_attention_layernorm.weight",),
            Fusion.NONE,
            Sharding.REPLICATED,
            (h,),
        ),
        (
            "mlp.linear_fc1.weight",
            (f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"),
            Fusion.GATE_UP,
            Sharding.GATED_COLUMN,
            (2 * f, h),
        ),
        (
            "mlp.linear_fc2.weight",
            (f"{hf}mlp.down_proj.weight",),
            Fusion.NONE,
            Sharding.ROW,
            (h, f),
        ),
    ]
    return [
        WeightSpec(meg + name, stage, names, fusion, sharding, full)
        for name, names, fusion, sharding, full in rows
    ]


def weight_groups(layout: MegatronLayout) -> Iterator[list[WeightSpec]]:
    """Every Megatron weight of the model, in groups that convert together: the embedding,
    then one group per decoder layer in global order, then the final norm and output layer."""
    shape, last = layout.shape, layout.pipeline_parallel - 1
    embedding = (layout.padded_vocab_size, shape.hidden_size)
    yield [
        WeightSpec(
            "embedding.word_embeddings.weight",
            0,
            ("model.embed_tokens.weight",),
            Fusion.VOCAB,
            Sharding.COLUMN,
            embedding,
        )
    ]
    for layer in range(shape.num_layers):
        yield _layer_specs(layout, layer)
    head = [
        WeightSpec(
            "decoder.final_layernorm.weight",
            last,
            ("model.norm.weight",),
            Fusion.NONE,
            Sharding.REPLICATED,
            (shape.hidden_size,),
        )
    ]
    if not shape.tie_word_embeddings or layout.pipeline_parallel > 1:
        tied = shape.tie_word_embeddings
        source = "model.embed_tokens.weight" if tied else "lm_head.weight"
        head.append(
            WeightSpec(
                "output_layer.weight",
                last,
                (source,),
                Fusion.VOCAB,
                Sharding.COLUMN,
                embedding,
                tied,
            )
        )
    yield head


def stage_specs(layout: MegatronLayout, stage: int) -> list[WeightSpec]:
    """The weights pipeline ``stage`` holds, in :func:`weight_groups` order."""
    return [spec for group in weight_groups(layout) for spec in group if spec.stage == stage]


def _check_shape(name: str, tensor: Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {expected}")


def fuse(layout: MegatronLayout, spec: WeightSpec, hf_tensors: Sequence[Tensor]) -> Tensor:
    """The full Megatron tensor of ``spec`` from its Hugging Face tensors, in ``hf_names`` order."""
    if len(hf_tensors) != len(spec.hf_names):
        raise ValueError(f"{spec.name} takes {len(spec.hf_names)} tensors, got {len(hf_tensors)}")
    if spec.fusion is Fusion.QKV:
        groups, d = layout.shape.num_key_value_heads, layout.shape.head_dim
        q, k, v = hf_tensors
        rest = tuple(q.shape[1:])
        for name, tensor, heads in zip(
            spec.hf_names,
            hf_tensors,
            (groups * layout.queries_per_group, groups, groups),
            strict=True,
        ):
            _check_shape(name, tensor, (heads * d, *rest))
        per_group = [t.reshape(groups, -1, *rest) for t in (q, k, v)]
        fused = torch.cat(per_group, dim=1).reshape(-1, *rest)
    elif spec.fusion is Fusion.GATE_UP:
        half = (spec.shape[0] // 2, *spec.shape[1:])
        for name, tensor in zip(spec.hf_names, hf_tensors, strict=True):
            _check_shape(name, tensor, half)
        fused = torch.cat(list(hf_tensors), dim=0)
    elif spec.fusion is Fusion.VOCAB:
        (table,) = hf_tensors
        _check_shape(spec.hf_names[0], table, (layout.shape.vocab_size, *spec.shape[1:]))
        padding = table.new_zeros(spec.shape[0] - table.shape[0], *spec.shape[1:])
        fused = torch.cat([table, padding], dim=0)
    else:
        (fused,) = hf_tensors
    _check_shape(spec.name, fused, spec.shape)
    return fused


def unfuse(layout: MegatronLayout, spec: WeightSpec, tensor: Tensor) -> list[tuple[str, Tensor]]:
    """The Hugging Face ``(name, tensor)`` pairs of the full Megatron tensor of ``spec`` (views)."""
    _check_shape(spec.name, tensor, spec.shape)
    if spec.tied_copy:
        return []
    if spec.fusion is Fusion.QKV:
        shape = layout.shape
        groups, d, rest = shape.num_key_value_heads, shape.head_dim, tuple(tensor.shape[1:])
        per_group = tensor.reshape(groups, -1, *rest)
        parts = per_group.split([layout.queries_per_group * d, d, d], dim=1)
        pieces = [part.reshape(-1, *rest) for part in parts]
    elif spec.fusion is Fusion.GATE_UP:
        pieces = list(tensor.chunk(2, dim=0))
    elif spec.fusion is Fusion.VOCAB:
        pieces = [tensor[: layout.shape.vocab_size]]
    else:
        pieces = [tensor]
    return list(zip(spec.hf_names, pieces, strict=True))
