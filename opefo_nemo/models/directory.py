"""What a model directory of the user's own must hold before any engine loads it: ``config.json``
naming a causal language model transformers builds, weights, a tokenizer; a GGUF file is not one.
Each problem is one phrase naming what is missing (docs/training.md, "Errors").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
"""Unsharded weights, as transformers looks for them."""
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
"""The index of sharded weights: each weight's shard file."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "tokenizer.tiktoken",
)
"""Files that hold a tokenizer's vocabulary (a ``tokenizer_config.json`` alone holds none)."""
TOKENIZER_SUBDIR = "tokenizer"
"""Where a model keeps its tokenizer when not beside ``config.json`` (the tiny models)."""
WEIGHT_PATTERNS = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.h5",
    "*.msgpack",
    "*.gguf",
    "*.safetensors.index.json",
    "*.bin.index.json",
)
"""Files of a model directory that hold (or index) weights in any of the formats transformers
and llama.cpp write: never copied from a source model beside weights saved anew."""
GGUF_MAGIC = b"GGUF"


def copy_beside_weights(source: Path, target: Path) -> None:
    """Every file and folder of the model directory ``source`` except its weights into
    ``target``, where ``target`` has none of that name yet: the tokenizer (its files beside
    ``config.json`` or its ``tokenizer/`` folder), the chat template and anything else the
    model's loaders read, so that weights saved into ``target`` make a directory that vLLM,
    ``opefo-eval`` and transformers load on their own. What ``target`` holds (the config the
    weights were saved with) stays."""
    target.mkdir(parents=True, exist_ok=True)
    weights = shutil.ignore_patterns(*WEIGHT_PATTERNS)
    for entry in sorted(source.iterdir()):
        destination = target / entry.name
        if destination.exists() or weights(str(source), [entry.name]):
            continue
        if entry.is_dir():
            shutil.copytree(entry, destination, ignore=weights)
        else:
            shutil.copy2(entry, destination)


def is_gguf(path: Path) -> bool:
    """A GGUF file (llama.cpp's single-file format), by its name or its first four bytes."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as file:
            return file.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _gguf_advice(name: str) -> str:
    return (
        f"{name} is a GGUF file (llama.cpp's format), which the engines do not load: give the "
        "Hugging Face model directory it was made from (config.json, safetensors weights, "
        "tokenizer)"
    )


def _weights_problem(path: Path, name: str) -> str | None:
    for index in WEIGHT_INDEXES:
        if (path / index).is_file():
            try:
                shards = sorted(set(json.loads((path / index).read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                return f"{name}: {index} is not a weight index (no readable weight_map)"
            missing = [shard for shard in shards if not (path / shard).is_file()]
            if missing:
                return (
                    f"{name}: {len(missing)} of the {len(shards)} weight files {index} lists are "
                    f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
                )
            return None
    if any((path / file).is_file() for file in WEIGHT_FILES):
        return None
    others = sorted(
        p.name for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".gguf")
    )
    held = f"; it holds {', '.join(others[:3])}" if others else ""
    return (
        f"{name} has no weights (model.safetensors, pytorch_model.bin, or the shards of "
        f"{WEIGHT_INDEXES[0]}){held}"
    )


def _tokenizer_problem(path: Path, name: str) -> str | None:
    directory = path / TOKENIZER_SUBDIR if (path / TOKENIZER_SUBDIR).is_dir() else path
    if any((directory / file).is_file() for file in TOKENIZER_FILES):
        return None
    where = f"{TOKENIZER_SUBDIR}/" if directory != path else "it"
    return f"{name} has no tokenizer (none of {', '.join(TOKENIZER_FILES)} in {where})"


def model_files_problem(path: Path, name: str) -> str | None:
    """Why the directory ``path`` cannot be loaded, judged by its files alone, or None:
    a GGUF file or another file, no ``config.json`` or an unreadable one, no ``model_type``,
    weights missing (a shard its index lists included), no tokenizer. ``name`` is how the
    message names the path (``model.path=/models/x``)."""
    if path.is_file():
        return _gguf_advice(name) if is_gguf(path) else f"{name} is a file, not a model directory"
    if not path.is_dir():
        return f"{name} does not exist"
    config_file = path / "config.json"
    if not config_file.is_file():
        gguf = sorted(p.name for p in path.glob("*.gguf"))
        if gguf:
            return f"{name} holds {gguf[0]} but no config.json: {_gguf_advice(gguf[0])}"
        return f"{name} is not a Hugging Face model directory (no config.json)"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as error:
        return f"{name}: config.json is not readable JSON ({' '.join(str(error).split())})"
    if not isinstance(config, dict) or not config.get("model_type"):
        return f"{name}: config.json names no model_type, so no engine knows what to build"
    return _weights_problem(path, name) or _tokenizer_problem(path, name)


def architecture_problem(path: Path, name: str) -> str | None:
    """Why the model in ``path`` (whose files :func:`model_files_problem` accepted) is not a
    causal language model the installed transformers builds, or None. The engines load it as
    one (``AutoModelForCausalLM``; the megatron engines map its weights), and run no code the
    directory brings (``auto_map``)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads((path / "config.json").read_text())
    model_type = str(config["model_type"])
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return None
    architectures = ", ".join(config.get("architectures") or []) or "none named"
    own_code = " (its own code, auto_map, is not run)" if "auto_map" in config else ""
    return (
        f"{name}: model_type {model_type!r} (architectures: {architectures}) is not a causal "
        f"language model that transformers {transformers.__version__} builds{own_code}"
    )
