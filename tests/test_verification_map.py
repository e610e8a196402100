"""docs/verification.md is the map of what runs where: every function that CPU coverage leaves
out (``# pragma: no cover`` on its ``def`` line) says in its name or docstring that it needs
CUDA, Transformer Engine or NeMo, and the map lists it (``path::name``) with what exercises it;
a module left out whole (``[tool.coverage.run] omit``) says so in its docstring and is listed
(``path``); the map lists nothing else. The coverage floors' checker
(scripts/check_coverage.py) reports every floor a report misses."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "docs" / "verification.md"
NEEDS = re.compile(r"cuda|gpu|transformer.engine|\bte\b|nemo", re.IGNORECASE)
PRAGMA = "pragma: no cover"


def excluded_functions() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """``path::qualified name`` of every function whose ``def`` line carries the pragma."""
    found = {}
    for path in sorted((ROOT / "opefo_nemo").rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef) and PRAGMA in lines[child.lineno - 1]:
                        found[f"{path.relative_to(ROOT).as_posix()}::{name}"] = child
                    stack.append((child, f"{name}."))
    return found


def test_every_pragma_sits_on_a_def_line():
    """No other line is left out of coverage: a branch inside a function is not excluded."""
    for path in sorted((ROOT / "opefo_nemo").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if PRAGMA in line:
                assert line.lstrip().startswith(("def ", "async def ")), f"{path}:{number}"


def omitted_modules() -> list[str]:
    """The modules ``[tool.coverage.run] omit`` leaves out whole."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        patterns = tomllib.load(file)["tool"]["coverage"]["run"].get("omit", [])
    return [pattern.removeprefix("*/") for pattern in patterns]


def test_left_out_functions_say_what_they_need_and_are_mapped():
    text = MAP.read_text()
    listed = set(re.findall(r"`(opefo_nemo/[\w/]+\.py::[\w.]+)`", text))
    functions = excluded_functions()
    for key, node in functions.items():
        doc = ast.get_docstring(node) or ""
        assert NEEDS.search(node.name) or NEEDS.search(doc), f"{key}: say CUDA / TE / NeMo"
        assert key in listed, f"{key} is left out of coverage but not in docs/verification.md"
    assert listed <= set(functions), sorted(listed - set(functions))


def test_left_out_modules_say_what_they_need_and_are_mapped():
    text = MAP.read_text()
    listed = set(re.findall(r"`(opefo_nemo/[\w/]+\.py)`", text))
    for path in omitted_modules():
        doc = ast.get_docstring(ast.parse((ROOT / path).read_text())) or ""
        assert re.search(r"only runs on cuda|needs? (cuda|nemo)", doc, re.IGNORECASE), path
        assert path in listed, f"{path} is left out of coverage but not in docs/verification.md"


def _checker():
    spec = importlib.util.spec_from_file_location("check", ROOT / "scripts" / "check_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_coverage_checker_names_every_missed_floor():
    report = {
        "totals": {"percent_covered": 94.0},
        "files": {
            "opefo_nemo/a.py": {"summary": {"percent_covered": 84.9}},
            "opefo_nemo/b.py": {"summary": {"percent_covered": 99.0}},
            "opefo_nemo/c.py": {"summary": {"percent_covered": 60.0}},
            "opefo_nemo/d.py": {"summary": {"percent_covered": 90.0}},
        },
    }
    floors = {
        "total": 95.0,
        "module": 85.0,
        "lower": {"opefo_nemo/c.py": 50.0, "opefo_nemo/d.py": 70.0, "opefo_nemo/gone.py": 1.0},
    }
    checker = _checker()
    assert checker.problems(report, floors) == [
        "total 94.0 % < 95.0 %",
        "opefo_nemo/a.py: 84.9 % < 85.0 %",
        "opefo_nemo/gone.py: listed in [lower] but not measured (renamed or deleted?)",
    ]
    assert checker.raised(report, floors) == [
        "opefo_nemo/d.py: 90.0 % reaches 85.0 %: its [lower] entry can go"
    ]
    report["totals"]["percent_covered"] = 95.0
    report["files"]["opefo_nemo/a.py"]["summary"]["percent_covered"] = 85.0
    del floors["lower"]["opefo_nemo/gone.py"]
    assert checker.problems(report, floors) == []
