"""The code blocks of docs/core.md, so that the tests run its examples exactly as written."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "core.md"


def docs_block(language: str, first_line: str) -> str:
    """The fenced ``language`` block of docs/core.md whose first line starts with ``first_line``."""
    for block in re.findall(rf"```{language}\n(.*?)```", DOCS.read_text(), re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"docs/core.md has no {language} block starting with {first_line!r}")
