"""The layering of docs/architecture.md, read from the source: imports between our packages only
point down, and only ``engines/aligner`` imports NeMo or NeMo-Aligner."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import opefo_nemo

PACKAGE = Path(opefo_nemo.__file__).parent

#: Top to bottom: a package may import only packages listed after it (docs/architecture.md "Layers",
#: with the support packages placed where their users put them).
LAYERS = (
    "cli",
    "report",
    "probe",
    "trainer",
    "orchestration",
    "engines",
    "config",
    "launch",
    "rollout",
    "tasks",
    "rewards",
    "eval",
    "data",
    "models",
    "parallel",
    "kernels",
    "core",
)


def _imports(path: Path) -> list[tuple[str, int]]:
    """``(absolute module, line)`` of every import in ``path`` (relative ones resolved)."""
    here = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((module, node.lineno))
            if module == "opefo_nemo":  # `from opefo_nemo import trainer` names packages
                found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "opefo_nemo" and len(parts) > 1 else None


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages <= set(LAYERS), packages - set(LAYERS)


def test_the_architecture_page_lists_the_layers_in_this_order():
    """docs/architecture.md's "Layers" table is the picture of :data:`LAYERS`: one row a package,
    top to bottom in the same order."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = page.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `(\w+)/` \|", table, re.M) == list(LAYERS)


def test_imports_only_point_down():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).parts[0]
        if own not in LAYERS:
            continue
        for module, line in _imports(path):
            target = _package_of(module)
            if target in LAYERS and LAYERS.index(target) < LAYERS.index(own):
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert upward == []


def test_only_the_aligner_engine_imports_nemo():
    aligner = PACKAGE / "engines" / "aligner"
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line} imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if aligner not in path.parents
        for module, line in _imports(path)
        if module.split(".")[0] in ("nemo", "nemo_aligner")
    ]
    assert offenders == []
