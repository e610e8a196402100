"""The repository speaks of the product: no tracked file cites an outside specification, a
tracker's issue number, or a path of one particular machine. docs/spec.md and
docs/architecture.md are the references the code cites ("spec §N")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What must not come back, each with why. A bracketed letter keeps each pattern from matching
#: its own source line, so this file is checked like every other.
FORBIDDEN = {
    r"\bSPE[C]\.md\b|\bARCHITECTUR[E]\.md\b": "an outside file (docs/spec.md is ours)",
    r"\bSPE[C] §": "cite the repository's spec as 'spec §N' (docs/spec.md)",
    r"beside the rep[o]sitory": "users only have the repository",
    r"\bi[s]sue #?\d+\b": "a tracker's issue number",
    r"/w[o]rk/": "a path of one particular machine",
    r"\bl[e]nt to\b|\bGPU s[e]ssion\b|\bthe d[e]vice tool\b": "how it was built, not the product",
}


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    paths = [ROOT / name.decode() for name in listed if name]
    return [p for p in paths if p.is_file()]


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


#: One sentence per pattern, assembled so that this file itself holds none of them.
PLANTED = [
    "see " + "SPEC" + ".md for details",
    "see " + "SPEC" + " §3",
    "kept " + "beside" + " the repository",
    "fixed in " + "issue" + " 12",
    "cache in /" + "work" + "/main/.cache",
    "no GPU was " + "lent" + " to this task",
]


@pytest.mark.parametrize("planted", PLANTED)
def test_a_planted_word_is_found(tmp_path, planted):
    file = tmp_path / "module.py"
    file.write_text(f'"""Docstring."""\n# {planted}\n')
    (found,) = offending_lines([file])
    assert found.startswith(f"{file}:2:")
