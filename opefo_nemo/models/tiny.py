"""A tiny Qwen2-architecture causal LM with a character-level tokenizer (one token id per
character), built locally from a seeded random initialisation: nothing is downloaded. The
directory it writes loads in ``transformers`` and vLLM's CPU build (docs/rollout.md, "The tiny
model").
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import string
import tempfile
from pathlib import Path
from typing import Any

import torch

from opefo_nemo.models.transformers_compat import quiet_progress

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>")
"""Special tokens, ids 0, 1, 2 in this order."""

ALPHABET: str = (
    string.digits + "+-*/=()?:.," + " \n" + string.ascii_lowercase + string.ascii_uppercase
)
"""The characters the tokenizer knows, one token each, ids ``len(SPECIAL_TOKENS) + i``."""

VOCAB: tuple[str, ...] = SPECIAL_TOKENS + tuple(ALPHABET)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

_MANIFEST = "opefo_tiny_model.json"
TOKENIZER_SUBDIR = "tokenizer"
"""The tokenizer lives in this subdirectory of the model directory, not beside ``config.json``:
transformers 5 maps ``model_type: qwen2`` to ``Qwen2Tokenizer``, whose byte-level pre-tokenizer
would silently replace ours if ``AutoTokenizer`` saw the model's config."""


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny Qwen2 model (``hidden_size = num_attention_heads * head_dim`` is not
    required by Qwen2, but ``num_attention_heads`` must be a multiple of ``num_key_value_heads``).
    vLLM's CPU attention needs ``head_dim`` 64 (16 is rejected), hence the default.

    ``initializer_range`` is the std of the random normal initialisation; the Hugging Face default
    0.02 gives nearly uniform next-token distributions, larger values give peakier ones.
    """

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    head_dim: int = 64
    num_key_value_heads: int = 1
    intermediate_size: int = 256
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int", "float") and not value > 0:
                raise ValueError(f"TinyModelSpec.{field.name} must be positive, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"TinyModelSpec.num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )


def encode(text: str) -> list[int]:
    """Token ids of ``text``, one per character (no special tokens added).

    Raises ``ValueError`` naming the first character outside :data:`ALPHABET`.
    """
    ids = []
    for position, char in enumerate(text):
        index = ALPHABET.find(char)
        if index < 0:
            raise ValueError(f"character {char!r} at position {position} is not in the alphabet")
        ids.append(index + len(SPECIAL_TOKENS))
    return ids


def decode(ids: list[int]) -> str:
    """Inverse of :func:`encode`; special tokens are dropped."""
    return "".join(VOCAB[i] for i in ids if i >= len(SPECIAL_TOKENS))


def _qwen2_config(spec: TinyModelSpec):
    from transformers import Qwen2Config

    # Written into config.json under these names, which vLLM and every transformers release
    # read; transformers 5 takes them as extra keyword arguments, not named parameters.
    written: dict[str, Any] = {
        "head_dim": spec.head_dim,
        "rope_theta": spec.rope_theta,
        "torch_dtype": "float32",
    }
    return Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        **written,
    )


def _save_tokenizer(directory: Path, max_length: int) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    word_level = models.WordLevel(vocab={tok: i for i, tok in enumerate(VOCAB)}, unk_token=None)
    tokenizer = Tokenizer(word_level)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(directory)


def load_tokenizer(model_dir: str | os.PathLike):
    """The Hugging Face fast tokenizer of a model directory written by :func:`build_tiny_model`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(model_dir) / TOKENIZER_SUBDIR)


def build_tiny_model(
    out_dir: str | os.PathLike, spec: TinyModelSpec | None = None, seed: int = 0
) -> Path:
    """Write config, ``model.safetensors`` and (under ``tokenizer/``) the tokenizer files of the
    tiny model to ``out_dir``.

    Idempotent: if ``out_dir`` already holds the model for the same ``spec`` and ``seed`` it
    returns at once; if it holds anything else it raises ``FileExistsError`` (never overwrites).
    The files are written into a temporary sibling directory and renamed, so a concurrent or
    interrupted build never leaves a half-written model behind. Returns ``Path(out_dir)``.
    """
    spec = spec if spec is not None else TinyModelSpec()
    target = Path(out_dir)
    manifest = {"spec": dataclasses.asdict(spec), "seed": seed, "vocab": list(VOCAB)}
    if target.exists():
        return _check_existing(target, manifest)

    from transformers import Qwen2ForCausalLM

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(_qwen2_config(spec)).to(torch.float32)  # type: ignore[arg-type]  # transformers wraps Module.to untyped
        torch.random.set_rng_state(generator_state)
        with quiet_progress():
            model.save_pretrained(staging, safe_serialization=True)
        _save_tokenizer(staging / TOKENIZER_SUBDIR, spec.max_position_embeddings)
        (staging / _MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            staging.rename(target)
        except OSError:
            if not target.exists():
                raise
            return _check_existing(target, manifest)  # another process won the race
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


def _check_existing(target: Path, manifest: dict) -> Path:
    manifest_path = target / _MANIFEST
    if not manifest_path.is_file():
        raise FileExistsError(f"{target} exists and is not a tiny model built by build_tiny_model")
    existing = json.loads(manifest_path.read_text())
    if existing != manifest:
        raise FileExistsError(
            f"{target} holds a tiny model built with spec={existing['spec']} "
            f"seed={existing['seed']}, not spec={manifest['spec']} seed={manifest['seed']}; "
            "choose another directory"
        )
    return target
