"""Module docstrings stay short pointers: what the module is and where docs/ explain more, in at
most :data:`MAX_LINES` lines; the detail belongs at the function or line it explains. Every
``docs/<file>.md, "<section>"`` a module docstring names must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import opefo_nemo

PACKAGE = Path(opefo_nemo.__file__).parent
DOCS = PACKAGE.parent / "docs"

MAX_LINES = 5
"""The longest module docstring allowed, in lines of ``ast.get_docstring``'s cleaned text."""

#: ``docs/<file>.md, "<section>"`` (or ``docs/<file>.md: "<a>", "<b>"``) in a docstring.
_POINTER = re.compile(r'docs/([\w-]+\.md)[,:]\s*((?:"[^"]+"(?:,\s*)?)+)')


def module_docstring_lines(source: str) -> int:
    """Lines of the module docstring of ``source`` (0 when it has none)."""
    doc = ast.get_docstring(ast.parse(source))
    return len(doc.splitlines()) if doc else 0


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _headings(doc: Path) -> list[str]:
    return [
        re.sub(r"[`*]", "", line.lstrip("#").strip())
        for line in doc.read_text().splitlines()
        if line.startswith("#")
    ]


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


def test_the_docs_sections_module_docstrings_point_to_exist():
    pointers = 0
    broken = []
    for path in _modules():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        flat = " ".join(doc.split())
        for match in _POINTER.finditer(flat):
            target = DOCS / match.group(1)
            if not target.is_file():
                broken.append(f"{path.name}: {target.name} does not exist")
                continue
            headings = _headings(target)
            for section in re.findall(r'"([^"]+)"', match.group(2)):
                pointers += 1
                wanted = re.sub(r"[`*]", "", section)
                if not any(wanted in heading for heading in headings):
                    broken.append(f"{path.name}: {target.name} has no section {section!r}")
    assert pointers > 20  # the pattern still finds the pointers
    assert not broken, broken
