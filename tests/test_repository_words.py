"""The repository speaks of the product: no tracked file cites an outside specification, a
tracker's issue number, or a path of one particular machine. docs/spec.md and
docs/architecture.md are the references the code cites ("spec §N")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What must not come back, each with why.
FORBIDDEN = {
    r"\bSPEC\.md\b|\bARCHITECTURE\.md\b": "an outside file (docs/spec.md is ours)",
    r"\bSPEC §": "cite the repository's spec as 'spec §N' (docs/spec.md)",
    r"beside the repository": "users only have the repository",
    r"\bissue \d+\b|\bissue #\d+": "a tracker's issue number",
    r"/work/": "a path of one particular machine",
    r"\blent to\b|\bGPU session\b|\bthe device tool\b": "how it was built, not the product",
}
#: This file names the patterns themselves.
EXEMPT = {"tests/test_repository_words.py"}


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    paths = [ROOT / name.decode() for name in listed if name]
    return [p for p in paths if p.is_file() and str(p.relative_to(ROOT)) not in EXEMPT]


def offending_lines(files: list[Path]) -> list[str]:
    """``path:line: text (why)`` for every forbidden pattern in ``files``."""
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for pattern, why in FORBIDDEN.items():
                if re.search(pattern, line):
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    found.append(f"{where}:{number}: {line.strip()[:80]} ({why})")
    return found


def test_no_tracked_file_speaks_of_outside_things():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert offending_lines(_tracked_text_files()) == []


@pytest.mark.parametrize(
    "planted",
    ["see SPEC.md for details", "fixed in issue 12", "cache in /work/main/.cache", "see SPEC §3"],
)
def test_a_planted_word_is_found(tmp_path, planted):
    file = tmp_path / "module.py"
    file.write_text(f'"""Docstring."""\n# {planted}\n')
    (found,) = offending_lines([file])
    assert found.startswith(f"{file}:2:")
