"""Check a combined coverage report against the floors of scripts/coverage_floors.toml.

Usage: ``check_coverage.py COVERAGE_JSON FLOORS_TOML``. Fails (exit 1) naming every module below
its floor and the total below the total floor, and every ``[lower]`` entry of a module that is
not measured; notes (without failing) each ``[lower]`` module that reaches the common floor, so
that its entry can go.
"""

from __future__ import annotations

import json
import sys

import tomllib


def problems(report: dict, floors: dict) -> list[str]:
    """One line per floor the report misses (module docstring)."""
    found: list[str] = []
    total = report["totals"]["percent_covered"]
    if total < floors["total"]:
        found.append(f"total {total:.1f} % < {floors['total']} %")
    lower = floors.get("lower", {})
    for path, summary in sorted(report["files"].items()):
        covered = summary["summary"]["percent_covered"]
        floor = lower.get(path, floors["module"])
        if covered < floor:
            found.append(f"{path}: {covered:.1f} % < {floor} %")
    for path in sorted(set(lower) - set(report["files"])):
        found.append(f"{path}: listed in [lower] but not measured (renamed or deleted?)")
    return found


def raised(report: dict, floors: dict) -> list[str]:
    """The ``[lower]`` modules that reach the common floor (their entries can go)."""
    lower = floors.get("lower", {})
    return [
        f"{path}: {report['files'][path]['summary']['percent_covered']:.1f} % reaches "
        f"{floors['module']} %: its [lower] entry can go"
        for path in sorted(set(lower) & set(report["files"]))
        if report["files"][path]["summary"]["percent_covered"] >= floors["module"]
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: check_coverage.py COVERAGE_JSON FLOORS_TOML", file=sys.stderr)
        return 2
    with open(argv[0]) as file:
        report = json.load(file)
    with open(argv[1], "rb") as file:
        floors = tomllib.load(file)
    found = problems(report, floors)
    for line in raised(report, floors):
        print(f"coverage note: {line}")
    for line in found:
        print(f"coverage floor: {line}", file=sys.stderr)
    if not found:
        total = report["totals"]["percent_covered"]
        print(f"coverage: {total:.1f} % of opefo_nemo's lines; every module at its floor")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
