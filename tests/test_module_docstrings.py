"""Module docstrings stay short pointers: what the module is and where docs/ explain more, in at
most :data:`MAX_LINES` lines; the detail belongs at the function or line it explains (the
sections they cite are checked by tests/test_docs_links.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import opefo_nemo

PACKAGE = Path(opefo_nemo.__file__).parent

MAX_LINES = 5
"""The longest module docstring allowed, in lines of ``ast.get_docstring``'s cleaned text."""


def module_docstring_lines(source: str) -> int:
    """Lines of the module docstring of ``source`` (0 when it has none)."""
    doc = ast.get_docstring(ast.parse(source))
    return len(doc.splitlines()) if doc else 0


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_line_count_sees_a_long_docstring_and_a_missing_one():
    long = '"""One.\n\nTwo.\nThree.\nFour.\nFive.\nSix.\n"""\n\nx = 1\n'
    assert module_docstring_lines(long) == 7
    assert module_docstring_lines('"""One line."""\n') == 1
    assert module_docstring_lines("x = 1\n") == 0


def test_every_module_has_a_short_docstring():
    assert len(_modules()) > 100  # the package, not an empty directory
    too_long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in _modules()
        if (lines := module_docstring_lines(path.read_text())) > MAX_LINES
    }
    missing = [
        str(path.relative_to(PACKAGE.parent))
        for path in _modules()
        if module_docstring_lines(path.read_text()) == 0
    ]
    assert not too_long, (
        f"module docstrings over {MAX_LINES} lines (say what the module is and where docs/ "
        f"explain it; move the detail to the function or line it explains): {too_long}"
    )
    assert not missing, f"modules without a docstring: {missing}"
