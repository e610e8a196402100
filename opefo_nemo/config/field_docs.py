"""A configuration key's meaning is the docstring under its dataclass field (as megatron-core
documents its configs): reading those docstrings from the source, and writing a dataclass
instance as YAML, one key a line with its value and its meaning as the comment
(docs/training.md, "Configuration").
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import math
import re
import textwrap
from collections.abc import Callable
from typing import Any

import yaml

WIDTH = 100
"""The longest line written."""
COLUMN = 29
"""Where a key's comment starts, unless the key's line is longer."""
MAX_COLUMN = 56
"""A key line reaching past this gets its comment on the lines above it instead."""

Keep = Callable[[str, dataclasses.Field[Any]], bool]
"""Whether the leaf at a dotted path (its field given) is written; every leaf by default."""


def _class_node(cls: type) -> ast.ClassDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef)
    return node


def class_doc(cls: type) -> str:
    """The docstring ``cls`` itself has in its source (not one inherited or made by
    ``dataclass``); ``ValueError`` naming the class when it has none."""
    doc = ast.get_docstring(_class_node(cls))
    if not doc:
        raise ValueError(f"{cls.__name__} has no docstring to head its file under conf/")
    return doc


@functools.cache
def declared_docs(cls: type) -> dict[str, str]:
    """The docstring under each field that the body of ``cls`` itself declares."""
    node = _class_node(cls)
    docs = {}
    for statement, after in zip(node.body, [*node.body[1:], None], strict=True):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_doc(cls: type, name: str) -> str:
    """The meaning of field ``name`` of dataclass ``cls``: the docstring under the class that
    introduces the field, then those under each subclass that redeclares it (why its default
    differs there). ``ValueError`` naming the field when the introducing class documents none."""
    owners = [
        klass
        for klass in reversed(cls.__mro__)
        if dataclasses.is_dataclass(klass) and name in inspect.get_annotations(klass)
    ]
    docs = [declared_docs(klass).get(name) for klass in owners]
    if not docs or docs[0] is None:
        where = owners[0].__name__ if owners else cls.__name__
        raise ValueError(
            f"{where}.{name} has no docstring under it: a configuration key's meaning is the "
            "docstring under its field"
        )
    return " ".join(doc for doc in docs if doc)


def plain(text: str) -> str:
    """A docstring as comment text: one paragraph, reStructuredText literals as `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return " ".join(text.replace("``", "`").split())


def yaml_value(value: Any) -> str:
    """``value`` as a YAML flow scalar or list that reads back as the same value (OmegaConf's
    ``???`` and interpolations such as ``${method.name}`` written as they are)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(yaml_value(item) for item in value) + "]"
    if isinstance(value, str):
        return value if _plain_string(value) else json.dumps(value, ensure_ascii=False)
    raise TypeError(f"no YAML form for {value!r} ({type(value).__name__})")


def _float(value: float) -> str:
    """A float YAML 1.1 reads as one: a dot in the mantissa, a signed exponent (``1.0e-6``)."""
    if not math.isfinite(value):
        raise TypeError(f"no YAML form for {value!r} in conf/")
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    return f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exponent):+d}"


def _plain_string(value: str) -> bool:
    """Whether ``value`` written bare reads back as the same string (and not as a number)."""
    try:
        float(value)
        return False
    except ValueError:
        pass
    try:
        return value == value.strip() != "" and yaml.safe_load(value) == value
    except yaml.YAMLError:
        return False


def commented(text: str, comment: str, indent: int) -> list[str]:
    """The line ``text`` with ``comment`` beside it from :data:`COLUMN`, continued on aligned
    lines; above it, at ``indent``, when the line is too long for a comment beside it."""
    column = max(COLUMN, len(text) + 2)
    if column > MAX_COLUMN:
        above = _wrap(comment, WIDTH - indent - 2)
        return [*(" " * indent + "# " + line for line in above), text]
    first, *rest = _wrap(comment, WIDTH - column - 2)
    return [text.ljust(column) + "# " + first, *(" " * column + "# " + line for line in rest)]


def comment_block(text: str) -> list[str]:
    """``text`` as whole-line comments."""
    return ["# " + line for line in _wrap(text, WIDTH - 2)]


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(plain(text), width, break_on_hyphens=False, break_long_words=False) or [""]


def listing(
    instance: Any, keep: Keep | None = None, indent: int = 0, prefix: str = ""
) -> list[str]:
    """Every field of dataclass ``instance`` (those ``keep`` accepts) as commented YAML lines: a
    nested dataclass as a block of its own, under its key and the field's meaning."""
    lines: list[str] = []
    for f in dataclasses.fields(instance):
        value, path = getattr(instance, f.name), f"{prefix}{f.name}"
        comment = field_doc(type(instance), f.name)
        pad = " " * indent
        if dataclasses.is_dataclass(value):
            block = listing(value, keep, indent + 2, f"{path}.")
            if block:
                lines += [*commented(f"{pad}{f.name}:", comment, indent), *block]
        elif keep is None or keep(path, f):
            lines += commented(f"{pad}{f.name}: {yaml_value(value)}", comment, indent)
    return lines
