"""Models built locally (no downloads): the tiny Qwen2 model used by CI and the embedded default."""

from opefo_nemo.models.tiny import (
    ALPHABET,
    BOS_ID,
    EOS_ID,
    PAD_ID,
    TOKENIZER_SUBDIR,
    VOCAB,
    TinyModelSpec,
    build_tiny_model,
    decode,
    encode,
    load_tokenizer,
)

__all__ = [
    "ALPHABET",
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "TOKENIZER_SUBDIR",
    "VOCAB",
    "TinyModelSpec",
    "build_tiny_model",
    "decode",
    "encode",
    "load_tokenizer",
]
