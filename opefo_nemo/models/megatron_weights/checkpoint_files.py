"""The files of our sharded checkpoint format (a megatron ``torch_dist`` checkpoint plus
:data:`MANIFEST`), readable without megatron or a process group (docs/megatron.md, "Sharded
checkpoints").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

MANIFEST = "opefo_checkpoint.json"
"""The file that marks a directory as one of our sharded checkpoints: JSON naming the format, the
model keys' prefix, the optimizer's state names and the caller's ``extra``."""
FORMAT = "opefo-megatron-sharded"
VERSION = 1
OPTIMIZER_PREFIX = "optimizer."
"""Keys of optimizer state start with this; everything else under the prefix is the model."""


def tensor_metadata(directory: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{checkpoint key: (global shape, dtype)}`` of every tensor in the ``torch_dist``
    checkpoint ``directory``, read from its ``.metadata`` alone (no process group, no model):
    what ``opefo-export`` checks a checkpoint against a model with before reading any weight."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    directory = Path(directory)
    if not (directory / ".metadata").is_file():
        raise FileNotFoundError(
            f"{directory} is not a torch_dist checkpoint: it has no .metadata file"
        )
    metadata = FileSystemReader(str(directory)).read_metadata()
    return {
        key: (tuple(entry.size), entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }


def read_manifest(directory: Path) -> dict[str, Any]:
    """The :data:`MANIFEST` of our checkpoint ``directory``; raises naming what is missing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"sharded checkpoint {directory} does not exist")
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not an opefo sharded checkpoint: no {MANIFEST}")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(
            f"{path}: format {manifest.get('format')!r} version {manifest.get('version')!r}, "
            f"expected {FORMAT!r} version {VERSION}"
        )
    return manifest


def replace_directory(staging: Path, directory: Path) -> None:
    """Rename the complete ``staging`` to ``directory``, replacing an old one."""
    old = directory.parent / f".{directory.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    staging.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
