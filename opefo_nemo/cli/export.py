"""``opefo-export CHECKPOINT --out DIR``: a trained checkpoint → a Hugging Face model directory.

The checkpoints it reads, where config and tokenizer come from, and its errors: docs/megatron.md,
"``opefo-export``".
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from opefo_nemo.cli.usage import OneLineParser
from opefo_nemo.models.megatron_weights.checkpoint_files import MANIFEST
from opefo_nemo.models.megatron_weights.export import export_safetensors, export_sharded
from opefo_nemo.trainer.checkpoint import POLICY_SUBDIR, list_checkpoints

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


@dataclass(frozen=True)
class Source:
    """What to export: ``kind`` ``"sharded"`` (a ``torch_dist`` directory) or ``"safetensors"``;
    ``hf_model``: the run's ``model.path`` when CHECKPOINT is a trainer checkpoint."""

    kind: str
    path: Path
    hf_model: Path | None = None


def parse_size(text: str) -> int:
    """``"5GB"``, ``"500MB"``, ``"1000"`` (bytes) → bytes (decimal units, as Hugging Face)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"--max-shard-size {text!r} is not a size like 5GB, 500MB or 1000000")
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])
    if size <= 0:
        raise ValueError(f"--max-shard-size {text!r} must be positive")
    return size


def _weights_kind(directory: Path) -> str | None:
    if (directory / MANIFEST).is_file() or (directory / ".metadata").is_file():
        return "sharded"
    if any(directory.glob("*.safetensors")):
        return "safetensors"
    return None


def find_weights(directory: Path) -> tuple[str, Path]:
    """The weights in ``directory`` itself, else in exactly one of its subdirectories (a
    policy's ``model/``, a NeMo directory's ``model_weights/``)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} does not exist")
    kind = _weights_kind(directory)
    if kind:
        return kind, directory
    found = [
        (k, sub)
        for sub in sorted(directory.iterdir())
        if sub.is_dir() and (k := _weights_kind(sub))
    ]
    if len(found) != 1:
        listed = ", ".join(str(sub) for _, sub in found) or "none"
        raise FileNotFoundError(
            f"{directory} does not hold exactly one weights directory (a torch_dist checkpoint "
            f"with .metadata, or *.safetensors) in itself or a subdirectory: {listed}"
        )
    return found[0]


def resolve_source(checkpoint: str, checkpoint_dir: str | None) -> Source:
    """CHECKPOINT (and ``--checkpoint-dir`` for ``latest``) → what to export."""
    if checkpoint == "latest":
        if checkpoint_dir is None:
            raise ValueError("CHECKPOINT latest needs --checkpoint-dir")
        found = list_checkpoints(Path(checkpoint_dir))
        if not found:
            raise FileNotFoundError(f"--checkpoint-dir {checkpoint_dir} holds no checkpoint")
        path = found[-1]
    else:
        path = Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if not (path / "trainer_state.json").is_file():
        return Source(*find_weights(path))
    kind, weights = find_weights(path / POLICY_SUBDIR)
    config = path / "config.yaml"
    model_path = None
    if config.is_file():
        model_path = (yaml.safe_load(config.read_text()).get("model") or {}).get("path")
    return Source(kind, weights, Path(model_path) if model_path else None)


def hf_model_dir(source: Source, override: str | None) -> Path:
    """``--hf-model``, else the run's ``model.path``; it must exist."""
    if override is not None:
        path = Path(override)
        if not path.is_dir():
            raise FileNotFoundError(f"--hf-model {path} does not exist")
        return path
    if source.hf_model is None:
        raise ValueError(
            "pass --hf-model: CHECKPOINT is not a trainer checkpoint with a config.yaml that "
            "names model.path"
        )
    if not source.hf_model.is_dir():
        raise FileNotFoundError(
            f"the run's model.path {source.hf_model} does not exist here; pass --hf-model"
        )
    return source.hf_model


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="opefo-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint directory, or 'latest'")
    parser.add_argument("--out", required=True, help="the Hugging Face directory to write")
    parser.add_argument("--checkpoint-dir", help="where 'latest' looks (run's checkpoints/)")
    parser.add_argument("--hf-model", help="original Hugging Face model (default: model.path)")
    parser.add_argument(
        "--prefix", help="model key prefix in a torch_dist checkpoint (default: detected)"
    )
    parser.add_argument(
        "--max-shard-size", default="5GB", help="largest safetensors shard (default: 5GB)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    args = parse_args(argv)
    try:
        max_bytes = parse_size(args.max_shard_size)
        source = resolve_source(args.checkpoint, args.checkpoint_dir)
        hf_model = hf_model_dir(source, args.hf_model)
        options = {"overwrite": args.overwrite, "max_shard_bytes": max_bytes}
        if source.kind == "sharded":
            export_sharded(source.path, hf_model, Path(args.out), prefix=args.prefix, **options)
        else:
            export_safetensors(source.path, hf_model, Path(args.out), **options)
    except (FileNotFoundError, FileExistsError, ValueError) as error:  # the message names it
        print(f"opefo-export: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
