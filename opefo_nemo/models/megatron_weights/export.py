"""A checkpoint → a Hugging Face model directory (safetensors shards + index, config, tokenizer):
from a megatron ``torch_dist`` checkpoint (ours or NeMo's ``model_weights/``, read without megatron
or a process group) or from Hugging Face safetensors, checked against ``config.json`` first
(docs/megatron.md, "``opefo-export``").
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, load
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from opefo_nemo.models.directory import copy_beside_weights
from opefo_nemo.models.megatron_weights.checkpoint_files import (
    MANIFEST,
    OPTIMIZER_PREFIX,
    read_manifest,
    replace_directory,
    tensor_metadata,
)
from opefo_nemo.models.megatron_weights.layout import MegatronLayout
from opefo_nemo.models.megatron_weights.streaming import hf_named_weights
from opefo_nemo.models.megatron_weights.weight_mapping import WeightSpec, unfuse, weight_groups

log = logging.getLogger("opefo_nemo.export")
EMBEDDING = "embedding.word_embeddings.weight"
_LAYERS = "decoder.layers."
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
}


def read_hf_config(hf_model: Path) -> dict:
    """``hf_model/config.json``; raises naming the directory when it has none."""
    path = Path(hf_model) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"Hugging Face model {hf_model} has no config.json")
    return json.loads(path.read_text())


def hf_shapes(layout: MegatronLayout) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face weight name → its shape, in stream order (no tensor is allocated)."""
    shapes = {}
    for group in weight_groups(layout):
        for spec in group:
            for name, piece in unfuse(layout, spec, torch.empty(spec.shape, device="meta")):
                shapes[name] = tuple(piece.shape)
    return shapes


class ShardedCheckpoint:
    """A ``torch_dist`` checkpoint directory read as full Megatron tensors of a TP 1, PP 1 layout.

    ``prefix``: the model keys' prefix; ``None`` = from our manifest, else the unique prefix of
    a ``…embedding.word_embeddings.weight`` key outside the optimizer state.
    """

    def __init__(self, directory: Path, prefix: str | None = None) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"checkpoint {self.directory} does not exist")
        self.tensors = tensor_metadata(self.directory)
        self.prefix = self._prefix() if prefix is None else prefix
        self._reader = _CachedReader(str(self.directory))

    def _prefix(self) -> str:
        if (self.directory / MANIFEST).is_file():
            return read_manifest(self.directory)["model_prefix"]
        found = sorted(
            key.removesuffix(EMBEDDING)
            for key in self.tensors
            if key.endswith(EMBEDDING) and not key.startswith(OPTIMIZER_PREFIX)
        )
        if len(found) != 1:
            raise ValueError(
                f"checkpoint {self.directory}: cannot tell the model's key prefix from "
                f"{len(found)} '*{EMBEDDING}' keys {found}; pass --prefix"
            )
        return found[0]

    def model_keys(self) -> dict[str, tuple[int, ...]]:
        """Model tensor keys (prefix removed) → global shape; optimizer state excluded."""
        return {
            key.removeprefix(self.prefix): shape
            for key, (shape, _) in self.tensors.items()
            if key.startswith(self.prefix) and not key.startswith(OPTIMIZER_PREFIX)
        }

    def layout(self, hf_config: Mapping) -> MegatronLayout:
        """The TP 1 / PP 1 layout of ``hf_config`` whose padded vocabulary is the checkpoint's."""
        keys = self.model_keys()
        if EMBEDDING not in keys:
            raise ValueError(f"checkpoint {self.directory} has no {self.prefix}{EMBEDDING}")
        padded = keys[EMBEDDING][0]
        vocab = hf_config.get("vocab_size")
        if not isinstance(vocab, int) or vocab > padded:
            raise ValueError(
                f"checkpoint {self.directory}: {self.prefix}{EMBEDDING} has {padded} rows, "
                f"fewer than the Hugging Face config's vocab_size {vocab}"
            )
        # Padding multiple = V' itself: the layout's padded vocabulary is exactly the stored one,
        # whatever TP and multiple the checkpoint was written with.
        return MegatronLayout.from_hf_config(
            hf_config, make_vocab_size_divisible_by=padded, fused_layernorm=True
        )

    def check(self, layout: MegatronLayout, source: str) -> None:
        """Every weight of ``layout`` present with its shape, nothing else; errors name the key
        and both shapes (``source``: where ``layout`` came from)."""
        layers = layout.shape.num_layers
        expected = {
            key: (layers, *spec.shape) if layer is not None else spec.shape
            for spec in _specs(layout)
            for key, layer in [self._key(spec)]
        }
        actual = self.model_keys()
        for key, shape in expected.items():
            if key not in actual:
                raise ValueError(
                    f"checkpoint {self.directory} has no {self.prefix}{key} "
                    f"(shape {shape} from {source})"
                )
            if actual[key] != shape:
                raise ValueError(
                    f"checkpoint {self.directory}: {self.prefix}{key} has shape {actual[key]}, "
                    f"{source} implies {shape}"
                )
        unexpected = sorted(set(actual) - set(expected))
        if unexpected:
            raise ValueError(
                f"checkpoint {self.directory} holds weights {source} does not describe: "
                f"{', '.join(self.prefix + key for key in unexpected)}"
            )

    def fetch(self, spec: WeightSpec) -> Tensor:
        """The full Megatron tensor of ``spec`` (one layer's region of a stacked weight)."""
        key, layer = self._key(spec)
        full_key = self.prefix + key
        shape = (1, *spec.shape) if layer is not None else spec.shape
        offsets = (layer, *[0] * len(spec.shape)) if layer is not None else (0,) * len(shape)
        target = torch.empty(shape, dtype=self.tensors[full_key][1])
        planner = _RegionPlanner({full_key: offsets})
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
            load({full_key: target}, storage_reader=self._reader, planner=planner, no_dist=True)
        return target[0] if layer is not None else target

    def _key(self, spec: WeightSpec) -> tuple[str, int | None]:
        """Checkpoint key (without prefix) and layer index of ``spec``'s weight."""
        if not spec.name.startswith(_LAYERS):
            return spec.name, None
        index, _, rest = spec.name.removeprefix(_LAYERS).partition(".")
        return _LAYERS + rest, int(index)


def _specs(layout: MegatronLayout) -> list[WeightSpec]:
    return [spec for group in weight_groups(layout) for spec in group]


class _RegionPlanner(DefaultLoadPlanner):
    """Loads each target tensor from the region of its global tensor that starts at
    ``offsets[key]`` (the default planner loads whole global tensors)."""

    def __init__(self, offsets: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.offsets = offsets

    def create_local_plan(self) -> LoadPlan:
        items = []
        for key, target in self.state_dict.items():
            chunk = ChunkStorageMetadata(torch.Size(self.offsets[key]), target.size())
            assert self.metadata is not None  # set by the planner before planning
            stored = self.metadata.state_dict_metadata[key]
            assert isinstance(stored, TensorStorageMetadata)  # every exported entry is a tensor
            items += create_read_items_for_chunk_list(key, stored, [chunk])
        return LoadPlan(items)

    def resolve_tensor(self, read_item: ReadItem) -> Tensor:
        """The part of the target tensor one stored chunk fills (offsets relative to it)."""
        target = self.state_dict[read_item.dest_index.fqn]
        for dim, (start, length) in enumerate(
            zip(read_item.dest_offsets, read_item.lengths, strict=True)
        ):
            target = target.narrow(dim, start, length)
        return target


class _CachedReader(FileSystemReader):
    """Reads ``.metadata`` once (``load`` asks for it on every call)."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if not hasattr(self, "_cached"):
            self._cached = super().read_metadata(*args, **kwargs)
        return self._cached


def export_sharded(
    checkpoint: Path,
    hf_model: Path,
    out: Path,
    *,
    prefix: str | None = None,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """A ``torch_dist`` checkpoint (ours or NeMo's ``model_weights/``) → ``out``."""
    _check_out(Path(out), overwrite)
    config = read_hf_config(hf_model)
    source = ShardedCheckpoint(checkpoint, prefix)
    layout = source.layout(config)
    source.check(layout, f"{hf_model}/config.json")
    dtypes = {key: dtype for key, (_, dtype) in source.tensors.items()}
    dtype = dtypes[source.prefix + EMBEDDING]
    shapes = hf_shapes(layout)
    weights = hf_named_weights(layout, source.fetch)
    return write_hf_directory(out, weights, shapes, dtype, hf_model, overwrite, max_shard_bytes)


def export_safetensors(
    weights_dir: Path,
    hf_model: Path,
    out: Path,
    *,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Hugging Face safetensors under ``weights_dir`` (the ``hf`` engine's ``policy/model/``)
    → ``out``, checked name by name and shape by shape against ``hf_model``'s config."""
    from safetensors import safe_open

    _check_out(Path(out), overwrite)
    layout = MegatronLayout.from_hf_config(read_hf_config(hf_model))
    files = sorted(Path(weights_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{weights_dir} holds no *.safetensors weights")
    where: dict[str, Path] = {}
    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle is not iterable)
                where[name] = path
                piece = handle.get_slice(name)
                stored[name] = (tuple(piece.get_shape()), piece.get_dtype())
    shapes = hf_shapes(layout)
    tied_head = {"lm_head.weight"} - set(shapes)  # a tied model's file may repeat the embedding
    unexpected = sorted(set(where) - set(shapes) - tied_head)
    missing = sorted(set(shapes) - set(where))
    if missing or unexpected:
        raise ValueError(
            f"{weights_dir} does not hold the weights {hf_model}/config.json describes: "
            f"missing {missing}, unexpected {unexpected}"
        )
    for name, shape in shapes.items():
        if stored[name][0] != shape:
            raise ValueError(
                f"{where[name]}: {name} has shape {stored[name][0]}, "
                f"{hf_model}/config.json implies {shape}"
            )
    first = stored[next(iter(shapes))][1]
    if first not in _SAFETENSORS_DTYPES:
        raise ValueError(f"{weights_dir}: unsupported safetensors dtype {first}")

    def weights() -> Iterator[tuple[str, Tensor]]:
        for name in shapes:
            with safe_open(str(where[name]), framework="pt") as handle:
                yield name, handle.get_tensor(name)

    dtype = _SAFETENSORS_DTYPES[first]
    return write_hf_directory(out, weights(), shapes, dtype, hf_model, overwrite, max_shard_bytes)


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"output directory {out} is not empty; pass --overwrite to replace")


def plan_shards(
    shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype, max_shard_bytes: int
) -> list[list[str]]:
    """Names in stream order, cut into consecutive shards of at most ``max_shard_bytes`` each
    (a single larger tensor gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_hf_directory(
    out: Path,
    weights: Iterable[tuple[str, Tensor]],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: torch.dtype,
    hf_model: Path,
    overwrite: bool,
    max_shard_bytes: int,
) -> Path:
    """Write ``weights`` (in ``shapes`` order) as safetensors shards with an index into ``out``,
    with ``hf_model``'s non-weight files; atomic (a staging sibling renamed into place)."""
    from safetensors.torch import save_file

    out = Path(out)
    _check_out(out, overwrite)
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    copy_beside_weights(Path(hf_model), staging)
    shards = plan_shards(shapes, dtype, max_shard_bytes)
    files = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)]
    )
    stream = iter(weights)
    weight_map, total = {}, 0
    try:
        for names, file in zip(shards, files, strict=True):
            tensors = {}
            for expected in names:
                name, tensor = next(stream)
                if name != expected:
                    raise ValueError(f"weight stream gave {name} where {expected} was planned")
                tensors[name] = tensor.detach().to("cpu").contiguous().clone()
            save_file(tensors, str(staging / file), metadata={"format": "pt"})
            size = sum(t.numel() * t.element_size() for t in tensors.values())
            total += size
            weight_map.update(dict.fromkeys(tensors, file))
            log.info("wrote %s: %d tensors, %.1f MB", file, len(tensors), size / 1e6)
        if len(files) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        replace_directory(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported %d tensors (%.1f MB) to %s", len(weight_map), total / 1e6, out)
    return out
