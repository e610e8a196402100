"""Checking a ``conf/`` YAML file against the config dataclass of its section.

The rule (docs/training.md, "Configuration"): a key's default and meaning are its dataclass
field's (the default value, a docstring under the field). A file that holds a section's defaults
lists every field with the field's default, written as it is there (an interpolation such as
``${method.name}`` included), and a comment on each key's line; any other file (a variant group
option, a preset) sets only keys that are fields. :func:`default_problems` and
:func:`unknown_keys` return what breaks that, one line per key, so that a check of another
section's files (the methods') is one call.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

KEY_LINE = re.compile(r"^(\s*)([A-Za-z_]\w*):(.*)$")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
GLOBAL_HEADER = "# @package _global_"


def is_global(path: Path) -> bool:
    """Whether the file is a ``# @package _global_`` file (its top-level keys are sections)."""
    return GLOBAL_HEADER in path.read_text().splitlines()[:3]


def yaml_values(path: Path, section: str | None = None) -> dict[str, Any]:
    """Every leaf key of the file (of ``section`` within it), dotted, with its value as written:
    interpolations unresolved, lists as tuples; the ``defaults`` list left out."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(data, dict), path
    data.pop("defaults", None)
    if section is not None:
        data = data.get(section) or {}
    return _flatten(data)


def commented_keys(path: Path, section: str | None = None) -> set[str]:
    """The dotted keys whose line carries a ``#`` comment (outside quoted strings)."""
    found, stack = set(), []
    for line in path.read_text().splitlines():
        match = KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if "#" in QUOTED.sub("", match.group(3)):
            found.add(".".join(name for _, name in stack))
    if section is None:
        return found
    return {key.removeprefix(f"{section}.") for key in found if key.startswith(f"{section}.")}


def field_defaults(instance: Any) -> dict[str, Any]:
    """Every leaf field of a dataclass instance, dotted, with its value (nested dataclasses
    recursed into, lists as tuples)."""
    out = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            out.update({f"{f.name}.{k}": v for k, v in field_defaults(value).items()})
        else:
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


def unknown_keys(cls: type, path: Path, section: str | None = None) -> list[str]:
    """Keys the file sets (in ``section``) that are no field of ``cls``."""
    fields = _field_paths(cls)
    return [
        f"{path.name}: {_name(section, key)} is no field of {cls.__name__}"
        for key in yaml_values(path, section)
        if key not in fields
    ]


def default_problems(instance: Any, path: Path, section: str | None = None) -> list[str]:
    """What keeps ``path`` (its ``section``) from holding the defaults of ``instance`` (a
    dataclass built with its defaults): unknown keys, missing fields, other values, keys
    without a comment on their line."""
    written, defaults = yaml_values(path, section), field_defaults(instance)
    commented = commented_keys(path, section)
    problems = unknown_keys(type(instance), path, section)
    for key, default in defaults.items():
        name = _name(section, key)
        if key not in written:
            problems.append(f"{path.name}: {name} is missing (the field's default: {default!r})")
        elif not _same(written[key], default):
            problems.append(
                f"{path.name}: {name} is {written[key]!r}, the field's default {default!r}"
            )
        elif key not in commented:
            problems.append(f"{path.name}: {name} has no comment on its line")
    return problems


def undocumented_fields(cls: type) -> list[str]:
    """Fields of ``cls``, of the dataclasses it derives from and of its nested sections with no
    docstring right under them, the way megatron-core documents its config fields."""
    missing = []
    for f in dataclasses.fields(cls):
        nested = f.default_factory
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            missing += undocumented_fields(nested)
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        statements = body.body
        for i, node in enumerate(statements):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            after = statements[i + 1] if i + 1 < len(statements) else None
            documented = (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            )
            if not documented:
                missing.append(f"{klass.__name__}.{node.target.id}")
    return missing


def _same(written: Any, default: Any) -> bool:
    if isinstance(written, bool) != isinstance(default, bool):
        return False
    return written == default


def _name(section: str | None, key: str) -> str:
    return f"{section}.{key}" if section else key


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def _field_paths(cls: type, prefix: str = "") -> set[str]:
    """Every leaf field's dotted path; a nested section is a field whose default factory is a
    dataclass."""
    paths = set()
    for f in dataclasses.fields(cls):
        nested = f.default_factory
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            paths |= _field_paths(nested, f"{prefix}{f.name}.")
        else:
            paths.add(f"{prefix}{f.name}")
    return paths
