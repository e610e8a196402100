"""The shape of a decoder-only transformer (Qwen2, Qwen3, Llama families), read from a Hugging Face
``config.json``, and its parameter counts (each count at the method computing it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers that decide memory; every field is a count (no bytes here)."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False

    def __post_init__(self) -> None:
        check_positive_ints(
            self,
            (
                "hidden_size",
                "num_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "vocab_size",
            ),
        )

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a Hugging Face config mapping (``model_type`` qwen2, qwen3, llama, or alike).

        Qwen2 has Q/K/V biases; Qwen3 has per-head Q/K norms; ``head_dim`` defaults to
        ``hidden_size / num_attention_heads`` when the config does not state it.
        """
        missing = [
            key
            for key in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "vocab_size",
            )
            if key not in config
        ]
        if missing:
            raise ValueError(f"model config lacks {', '.join(missing)}")
        heads = int(config["num_attention_heads"])
        model_type = str(config.get("model_type", ""))
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type.startswith("qwen3"),
        )

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ModelShape:
        """From ``<path>/config.json``; raises ``FileNotFoundError`` naming the file if absent."""
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{config_file} does not exist")
        return cls.from_hf_config(json.loads(config_file.read_text()))

    @property
    def query_width(self) -> int:
        """``H·d``: the width of the query projection and of the attention output."""
        return self.num_attention_heads * self.head_dim

    @property
    def key_value_width(self) -> int:
        """``G·d``: the width of the key projection (and of the value projection)."""
        return self.num_key_value_heads * self.head_dim

    def attention_parameters(self) -> int:
        """Weights (and biases) of Q, K, V and O in one layer; all split across tensor parallel:
        ``h·H·d (Q) + 2·h·G·d (K, V) + H·d·h (O)``, plus ``H·d + 2·G·d`` biases (Qwen2)."""
        h, q, kv = self.hidden_size, self.query_width, self.key_value_width
        count = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            count += q + 2 * kv
        return count

    def mlp_parameters(self) -> int:
        """Gate, up and down projections of one layer (``3·h·f``); all split across tensor
        parallel."""
        return 3 * self.hidden_size * self.intermediate_size

    def attention_width(self) -> int:
        """``A``: the sequence width at which a position's causal attention costs as many FLOPs
        as its linear layers: a position's forward takes ``2·W`` FLOPs through a layer's
        weights ``W`` (attention and MLP) and ``2·H·d·w`` through its attention at width ``w``
        (``q·kᵀ`` and the sum of ``v`` over the ``w / 2`` earlier positions it sees on
        average), so ``A = W / (H·d)``, rounded. Qwen2.5-Math-7B: 65,025; Qwen3-4B-Base: 24,640.
        The batch-layout planner weighs a sequence of width ``w`` by ``w·(A + w)`` (spec §11)."""
        weights = self.attention_parameters() + self.mlp_parameters()
        return max(1, round(weights / self.query_width))

    def replicated_layer_parameters(self) -> int:
        """Parameters of one layer that every tensor-parallel rank holds whole (the norms):
        ``2·h``, plus ``2·d`` for per-head Q/K RMSNorm (Qwen3)."""
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    def layer_parameters(self) -> int:
        """All parameters of one decoder layer."""
        return (
            self.attention_parameters() + self.mlp_parameters() + self.replicated_layer_parameters()
        )

    def embedding_parameters(self, vocab_size: int | None = None) -> int:
        """``V·h`` for the input embedding (or the output layer), at ``vocab_size`` rows."""
        return (vocab_size or self.vocab_size) * self.hidden_size

    def total_parameters(self) -> int:
        """Every parameter of the unpadded model, as the Hugging Face checkpoint stores it: the
        layers, the embedding ``V·h``, the output layer ``V·h`` unless tied, the final norm
        ``h``."""
        output = 0 if self.tie_word_embeddings else self.embedding_parameters()
        return (
            self.num_layers * self.layer_parameters()
            + self.embedding_parameters()
            + output
            + self.hidden_size
        )


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    """Megatron's vocabulary padding: up to a multiple of ``divisible_by × tensor_parallel``."""
    multiple = divisible_by * tensor_parallel
    return math.ceil(vocab_size / multiple) * multiple


def check_positive_ints(instance: object, names: Iterable[str]) -> None:
    """Each field ``names`` of ``instance`` is a positive int; else a :class:`ValueError` naming
    ``Class.field`` and the value (the settings dataclasses' shared check)."""
    for name in names:
        value = getattr(instance, name)
        if not isinstance(value, int) or value <= 0:
            kind = type(instance).__name__
            raise ValueError(f"{kind}.{name} must be a positive integer, got {value!r}")
