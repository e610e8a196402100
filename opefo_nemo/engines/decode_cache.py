"""The KV cache of the rows that decode together (``engines/hf_generation.py``): finished rows
leave it, waiting rows join it left-padded, and the leading columns no remaining row attends to
are cut. A cache is transformers' ``Cache`` or a legacy per-layer ``(key, value)`` tuple, each
tensor ``[rows, heads, columns, head_dim]`` with a row's newest token in the last column.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def select_rows(cache: Any, index: Tensor) -> Any:
    """The cache of rows ``index`` (repeats allowed): transformers' ``Cache.reorder_cache``
    (every release since 4.36, every kind of layer), or each tensor of a legacy tuple."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(index)
        return cache
    return _mapped(cache, lambda tensor: tensor.index_select(0, index))


def joinable(cache: Any) -> bool:
    """Whether rows can join ``cache`` and its columns be cut: a legacy tuple, or a ``Cache``
    whose layers are all transformers' plain ``DynamicLayer`` (4.56 on: its ``keys`` and
    ``values`` are the whole state). Other layers (a sliding window's, a quantised or static
    cache's) and the per-layer lists of older releases keep more than those tensors: their rows
    can leave, not join."""
    if isinstance(cache, tuple):
        return True
    from transformers import cache_utils

    plain = getattr(cache_utils, "DynamicLayer", None)
    layers = getattr(cache, "layers", None)
    return plain is not None and layers is not None and all(type(x) is plain for x in layers)


def join(cache: Any, mask: Tensor, other: Any, other_mask: Tensor) -> tuple[Any, Tensor]:
    """``cache``'s rows then ``other``'s (both :func:`joinable`), with their attention masks
    ``[rows, columns]``: the narrower one left-padded with unattended columns (zeros, mask 0),
    so every row's newest token stays in the last column."""
    width = max(mask.shape[1], other_mask.shape[1])

    def padded(tensor: Tensor) -> Tensor:  # [rows, heads, columns, head_dim]
        return torch.nn.functional.pad(tensor, (0, 0, width - tensor.shape[-2], 0))

    layers = [
        tuple(torch.cat([padded(a), padded(b)]) for a, b in zip(mine, theirs, strict=True))
        for mine, theirs in zip(_layers(cache), _layers(other), strict=True)
    ]
    masks = [torch.nn.functional.pad(m, (width - m.shape[1], 0)) for m in (mask, other_mask)]
    return _rebuilt(cache, layers), torch.cat(masks)


def cut_unattended(cache: Any, mask: Tensor) -> tuple[Any, Tensor]:
    """``cache`` (:func:`joinable`) and ``mask`` without the leading columns that no row
    attends to: left padding that the rows which needed it took away when they left."""
    start = int(mask.any(dim=0).int().argmax())
    if start == 0:
        return cache, mask
    return _mapped(cache, lambda tensor: tensor[..., start:, :]), mask[:, start:]


def _layers(cache: Any) -> list[tuple[Tensor, ...]]:
    """Each layer's tensors: a legacy tuple's own, a ``DynamicLayer``'s ``keys`` and ``values``."""
    if isinstance(cache, tuple):
        return [tuple(layer) for layer in cache]
    return [(layer.keys, layer.values) for layer in cache.layers]


def _rebuilt(cache: Any, layers: list[tuple[Tensor, ...]]) -> Any:
    """``cache`` holding ``layers`` (a new legacy tuple, or its ``DynamicLayer``\\ s updated)."""
    if isinstance(cache, tuple):
        return tuple(layers)
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        layer.keys, layer.values = keys, values
    return cache


def _mapped(cache: Any, function: Callable[[Tensor], Tensor]) -> Any:
    """``cache`` with ``function`` applied to every tensor of every layer."""
    return _rebuilt(cache, [tuple(map(function, layer)) for layer in _layers(cache)])
