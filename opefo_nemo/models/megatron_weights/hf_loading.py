"""Load a Hugging Face checkpoint's safetensors straight into one rank's Megatron shards, at most
one full Megatron tensor alive at a time (docs/megatron.md, "Start-up of ``engine=megatron``").
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from opefo_nemo.models.megatron_weights.layout import MegatronLayout
from opefo_nemo.models.megatron_weights.tensor_parallel import split_for_rank
from opefo_nemo.models.megatron_weights.weight_mapping import fuse, stage_specs

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class SafetensorsFiles:
    """The tensors of a Hugging Face model directory: ``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` maps each name to. Use as a context manager."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        index = self.directory / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: self.directory / file for name, file in weight_map.items()}
        elif (self.directory / SINGLE).is_file():
            from safetensors import safe_open

            with safe_open(self.directory / SINGLE, framework="pt") as handle:
                self.files = {name: self.directory / SINGLE for name in handle.keys()}  # noqa: SIM118
        else:
            raise FileNotFoundError(
                f"{self.directory} holds neither {SINGLE} nor {INDEX}: engine=megatron reads "
                "Hugging Face safetensors checkpoints"
            )
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}  # safetensors' safe_open handles

    def __enter__(self) -> SafetensorsFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> Tensor:
        """The tensor ``name``; ``KeyError`` naming the directory when it is not there."""
        from safetensors import safe_open

        if name not in self.files:
            raise KeyError(f"{self.directory} has no weight {name}")
        path = self.files[name]
        if path not in self._handles:
            self._handles[path] = self._stack.enter_context(safe_open(path, framework="pt"))
        return self._handles[path].get_tensor(name)


def load_stage_weights(
    model: torch.nn.Module,
    layout: MegatronLayout,
    directory: str | Path,
    stage: int,
    tp_rank: int,
) -> None:
    """Copy the Hugging Face checkpoint at ``directory`` into ``model``, the megatron-core module
    of pipeline ``stage`` on tensor-parallel rank ``tp_rank`` (values cast to the parameters'
    dtype). Raises ``ValueError`` when the model's weights are not the ones ``layout`` expects
    and ``KeyError`` naming a Hugging Face weight the checkpoint lacks."""
    state = {k: v for k, v in model.state_dict().items() if "_extra_state" not in k}
    specs = stage_specs(layout, stage)
    expected = {spec.name for spec in specs}
    if set(state) != expected:
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"the model's weights are not the layout's: missing {missing}, unexpected {unexpected}"
        )
    tp = layout.tensor_parallel
    with SafetensorsFiles(directory) as files, torch.no_grad():
        for spec in specs:
            full = fuse(layout, spec, [files.get(name) for name in spec.hf_names])
            state[spec.name].copy_(split_for_rank(full, spec.sharding, tp, tp_rank, spec.name))
