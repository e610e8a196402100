"""Plain mappings (composed Hydra config) → frozen dataclasses, rejecting unknown keys: the one
validator of every configuration section, the trainer's and each method's. Every error names the
full key (``trainer.max_steps``). Pure Python.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def build(cls: type[T], data: Any, prefix: str) -> T:
    """An instance of dataclass ``cls`` from ``data`` (a mapping); missing keys keep defaults.
    Nested dataclasses recurse, scalars are type-checked (``int`` refuses floats and bools;
    ``float`` accepts ints), ``X | None`` accepts ``None``, ``float | str`` tries the types in
    order, and ``list[str]`` / ``list[int]`` become tuples."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"unknown key {prefix}.{unknown[0]} (known keys: {', '.join(sorted(known))})"
        )
    values = {name: _value(hints[name], value, f"{prefix}.{name}") for name, value in data.items()}
    try:
        return cls(**values)
    except TypeError as error:
        raise ValueError(f"{prefix}: {error}") from None


def _value(kind: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        if value is None:
            return None
        for option in options[:-1]:
            try:
                return _value(option, value, path)
            except ValueError:
                continue
        return _value(options[-1], value, path)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return build(kind, value if value is not None else {}, path)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ValueError(f"{path} must be a list, got {value!r}")
        item = typing.get_args(kind)[0]
        return tuple(_value(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path} must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path} must be an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path} must be a number, got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{path} must be a string, got {value!r}")
        return value
    if kind is Any:
        return value
    raise TypeError(f"{path}: unsupported config field type {kind!r}")


def require(ok: bool, path: str, message: str) -> None:
    """Raise ``ValueError("<path> <message>")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{path} {message}")


def one_of(value: str, options: tuple[str, ...], path: str) -> None:
    require(value in options, path, f"is {value!r}; expected one of {options}")
