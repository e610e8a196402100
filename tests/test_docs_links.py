"""Every link between the repository's pages resolves: each relative link and ``#anchor`` of the
Markdown pages (README.md, docs/, benchmarks/, tests/) names a file that exists and a heading it
has, by GitHub's anchor rules; and every ``docs/<page>.md, "<section>"`` that code, tests,
configuration or a page cites names a page that exists and a heading of it."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Where the pages live: the README and every Markdown file under these folders.
PAGE_FOLDERS = ("docs", "benchmarks", "tests")

#: Where citations of a page's section may stand: the sources, their configuration and scripts.
CITING_FOLDERS = ("opefo_nemo", "tests", "benchmarks", "scripts", "conf", "slurm", "containers")
CITING_SUFFIXES = (".py", ".md", ".yaml", ".sh", ".sbatch", ".toml")

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
#: ``docs/<page>.md, "<section>"``, ``docs/<page>.md: "<a>", "<b>"`` or ``docs/<page>.md "<a>"``.
_CITATION = re.compile(r'docs/([\w/-]+\.md)(?:[,:]\s*|\s+)((?:"[^"]+"(?:,\s*)?)+)')


def pages() -> list[Path]:
    """README.md and every Markdown page under :data:`PAGE_FOLDERS`."""
    found = [ROOT / "README.md"]
    for folder in PAGE_FOLDERS:
        found += sorted((ROOT / folder).rglob("*.md"))
    return found


def without_code(text: str) -> str:
    """``text`` without its fenced blocks and code spans (no link or heading stands there)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text (code spans and links as their text),
    lower-cased, punctuation dropped (letters of any script, digits, ``_`` and ``-`` kept),
    each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(page: Path) -> list[str]:
    """The page's headings as written (outside fenced blocks), in order."""
    return _HEADING.findall(_FENCE.sub("", page.read_text()))


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor of ``page``: a repeated slug gets ``-1``, ``-2``, ... as GitHub numbers it."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in headings(page):
        base = slug(heading)
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return frozenset(found)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``page`` whose file or anchor does not exist, named from ``root``."""
    broken = []
    for target in _LINK.findall(without_code(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def citations(text: str) -> list[tuple[str, str]]:
    """``(page, section)`` of every ``docs/<page>.md, "<section>"`` in ``text``, read across
    line breaks and the comment marks that start a continued line."""
    flat = " ".join(re.sub(r"\n\s*#:?", "\n", text).split())
    return [
        (match.group(1), section)
        for match in _CITATION.finditer(flat)
        for section in re.findall(r'"([^"]+)"', match.group(2))
    ]


def _plain(text: str) -> str:
    """``text`` without code and emphasis marks, as a section is cited."""
    return re.sub(r"[`*]", "", text)


def broken_citations(path: Path) -> list[str]:
    """The citations in ``path`` whose page or section does not exist."""
    broken = []
    for page, section in citations(path.read_text()):
        target = ROOT / "docs" / page
        where = f"{path.relative_to(ROOT)}: docs/{page}, {section!r}"
        if not target.is_file():
            broken.append(f"{where} (no such page)")
        elif not any(_plain(section) in _plain(heading) for heading in headings(target)):
            broken.append(f"{where} (no such section)")
    return broken


def citing_files() -> list[Path]:
    """The files whose citations are checked: README.md, the pages and every source and
    configuration file of :data:`CITING_FOLDERS`."""
    found = [ROOT / "README.md"]
    for folder in (*CITING_FOLDERS, "docs"):
        found += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in CITING_SUFFIXES)
    return [path for path in found if path != Path(__file__).resolve()]  # not its own examples


def test_slugs_follow_githubs_rules():
    assert slug("A real model's step beside TRL (`benchmarks/real_model_step.py`)") == (
        "a-real-models-step-beside-trl-benchmarksreal_model_steppy"
    )
    assert slug("7. `opefo-preflight`") == "7-opefo-preflight"
    assert slug("OPEFO on the embedded tasks: why it fails, in λ*") == (
        "opefo-on-the-embedded-tasks-why-it-fails-in-λ"
    )
    assert slug("Which regime is my run in? `opefo-probe`") == (
        "which-regime-is-my-run-in-opefo-probe"
    )


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Runs\n\n## Setup\n\n```bash\n# not a heading\n```\n\n## Setup\n\n## Setup\n")
    assert anchors(page) == {"runs", "setup", "setup-1", "setup-2"}


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Its section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[fine](other.md#its-section) [self](#a-heading) `[in code](nowhere.md)`\n"
        "[gone](missing.md) [no anchor](other.md#nothing) [web](https://example.org)\n\n"
        "## A heading\n"
    )
    assert broken_links(page.resolve(), root=tmp_path.resolve()) == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#nothing (no such heading)",
    ]


def test_citations_are_read_across_lines_and_comment_marks():
    text = '# (docs/training.md, "One forward for the\n    # statistics and the loss").\nx = 1'
    assert citations(text) == [("training.md", "One forward for the statistics and the loss")]
    assert citations('docs/spec.md: "§1", "§2" and docs/core.md "STEER"') == [
        ("spec.md", "§1"),
        ("spec.md", "§2"),
        ("core.md", "STEER"),
    ]


def test_every_link_and_anchor_of_the_pages_resolves():
    assert len(pages()) > 20  # the pages are found
    broken = [problem for page in pages() for problem in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_every_cited_section_exists():
    files = citing_files()
    assert sum(len(citations(path.read_text())) for path in files) > 50  # citations are found
    broken = [problem for path in files for problem in broken_citations(path)]
    assert not broken, "\n".join(broken)
