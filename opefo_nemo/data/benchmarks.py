"""The six evaluation benchmarks of spec §7, in the paper's column order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """name: file stem and key (`<data_dir>/<name>.jsonl`); title: the report column header;
    size: number of problems in the paper; samples: k of the paper's avg@k."""

    name: str
    title: str
    size: int
    samples: int


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("aime24", "AIME24", 30, 32),
    Benchmark("aime25", "AIME25", 30, 32),
    Benchmark("amc23", "AMC23", 40, 32),
    Benchmark("math500", "MATH500", 500, 1),
    Benchmark("minerva", "Minerva", 272, 1),
    Benchmark("olympiadbench", "Olympiad", 675, 1),
)
BENCHMARK_NAMES = tuple(b.name for b in BENCHMARKS)
PASS_AT_K_VALUES = (8, 16, 32, 64)  # the paper's pass@k scaling table, on AIME24


def benchmark(name: str) -> Benchmark:
    """The benchmark called `name` (one of `BENCHMARK_NAMES`)."""
    for candidate in BENCHMARKS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"unknown benchmark {name!r}; expected one of {BENCHMARK_NAMES}")
