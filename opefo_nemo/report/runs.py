"""Run directories as the trainer leaves them (``metrics.jsonl`` and ``config.yaml``), and runs
grouped by everything but their seed (docs/training.md, "Comparing methods and seeds").
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from opefo_nemo.config.train import TrainConfig
from opefo_nemo.report.derived import DERIVED
from opefo_nemo.trainer.metrics_log import RUN_CONFIG

log = logging.getLogger(__name__)
METRICS = "metrics.jsonl"

#: Flattened config keys (or key prefixes ending in ".") that do not make two runs different
#: experiments: the seed itself, bookkeeping, and process settings that leave the samples alone.
NOT_SETTINGS = (
    "run.",
    "checkpoint.",
    "metrics.",
    "validation.",
    "rollout.python",
    "rollout.startup_timeout_s",
    "rollout.request_timeout_s",
    "rollout.max_restarts",
    "reward.workers",
)


class RunDirectoryError(ValueError):
    """A path given as a run directory holds no readable ``metrics.jsonl``."""


@dataclass(frozen=True, eq=False)
class Run:
    """One run directory: its records in step order and its configuration (``None``: unknown).
    Compared and hashed by identity."""

    path: Path
    records: tuple[Mapping[str, Any], ...]
    config: Mapping[str, Any] | None

    @property
    def method(self) -> str | None:
        return None if self.config is None else self.config.get("method", {}).get("name")

    @property
    def seed(self) -> int | None:
        return None if self.config is None else self.config.get("run", {}).get("seed")

    @property
    def steps(self) -> int:
        """Rollout steps logged (step 0, the warm start's validation, is none)."""
        return sum(r["step"] > 0 for r in self.records)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps [n], values [n])`` of the records where ``key`` has a value (a non-finite
        value is logged as null and left out), or of a series of :mod:`.derived`."""
        if key in DERIVED:
            points = DERIVED[key](self.records)
        else:
            points = [(r["step"], r[key]) for r in self.records if r.get(key) is not None]
        steps = np.array([p[0] for p in points], dtype=np.int64)
        return steps, np.array([p[1] for p in points], dtype=np.float64)

    def has(self, key: str) -> bool:
        return bool(len(self.series(key)[0]))

    def describe(self) -> str:
        """``method seed s`` (or the directory name when the run records no configuration)."""
        if self.config is None:
            return self.path.name
        return f"{self.method} seed {self.seed}"


def load_run(path: Path) -> Run:
    """Read the run in directory ``path``; :class:`RunDirectoryError` names what is missing. The
    configuration is ``config.yaml`` beside ``metrics.jsonl``, else (runs written before the run
    directory recorded it) the newest checkpoint's; a run with neither is drawn on its own, named
    by its directory."""
    metrics = path / METRICS
    if not path.is_dir():
        raise RunDirectoryError(f"{path} is not a directory")
    if not metrics.is_file():
        raise RunDirectoryError(f"{path} holds no {METRICS}: not a run directory of opefo-train")
    records = []
    for number, line in enumerate(metrics.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise RunDirectoryError(f"{metrics}:{number} is not JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise RunDirectoryError(f"{metrics}:{number} is not an object with an integer step")
        records.append(record)
    if not records:
        raise RunDirectoryError(f"{metrics} is empty: the run logged no step")
    records.sort(key=lambda r: r["step"])
    return Run(path, tuple(records), _read_config(path))


def _read_config(path: Path) -> Mapping[str, Any] | None:
    """The run's ``config.yaml``, else its newest checkpoint's, else ``None``."""
    candidates = [path / RUN_CONFIG, *sorted(path.glob(f"checkpoints/step_*/{RUN_CONFIG}"))[-1:]]
    for candidate in candidates:
        if candidate.is_file():
            config = yaml.safe_load(candidate.read_text())
            if isinstance(config, dict):
                return config
    log.warning("%s records no %s: drawn on its own, named by its directory", path, RUN_CONFIG)
    return None


@dataclass(frozen=True)
class Group:
    """Runs of one method with equal settings (seeds of one experiment), and its legend label."""

    label: str
    runs: tuple[Run, ...]

    @property
    def method(self) -> str | None:
        return self.runs[0].method

    @cached_property
    def seeds(self) -> tuple[int | None, ...]:
        return tuple(run.seed for run in self.runs)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def completed(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened configuration, with each key it lacks (a run written before the key existed)
    at today's default, so that a key added later does not set an older run apart from a newer
    one that left it at its default; as recorded where today's validation refuses it (a key
    since renamed or removed)."""
    recorded = flatten(config)
    try:
        defaults = flatten(dataclasses.asdict(TrainConfig.from_mapping(config)))
    except (ValueError, TypeError, KeyError) as error:
        log.debug("configuration kept as recorded, today's validation refuses it: %s", error)
        return recorded
    return {**defaults, **recorded}


def settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The completed configuration less :data:`NOT_SETTINGS`: what makes runs one experiment."""
    return {
        key: value
        for key, value in completed(config).items()
        if not any(key == n or (n.endswith(".") and key.startswith(n)) for n in NOT_SETTINGS)
    }


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Runs with equal :func:`settings` form a group, in the order their first run was given.

    Labels: the method's name; where several groups share a method, the name followed by the
    settings that tell them apart (``opefo (method.lr=0.0003)``). A run without configuration is
    a group of its own, labelled by its directory.
    """
    members: dict[str, list[Run]] = {}
    for run in runs:
        key = (
            f"dir:{run.path.resolve()}"
            if run.config is None
            else json.dumps(settings(run.config), sort_keys=True, default=str)
        )
        members.setdefault(key, []).append(run)
    groups = [tuple(found) for found in members.values()]
    for found in groups:
        seeds = [run.seed for run in found]
        if len(set(seeds)) < len(seeds):
            log.warning(
                "%s: runs with the same settings and the same seed %s (repeats of one run)",
                ", ".join(str(run.path) for run in found),
                seeds,
            )
    return [Group(_label(found, groups), found) for found in groups]


def _label(found: tuple[Run, ...], groups: Iterable[tuple[Run, ...]]) -> str:
    first = found[0]
    config = first.config
    if config is None:
        return first.path.name
    name = str(first.method)
    same_method = [g[0] for g in groups if g[0].config is not None and g[0].method == first.method]
    if len(same_method) == 1:
        return name
    mine = settings(config)
    others = [settings(run.config) for run in same_method if run is not first and run.config]
    keys = set(mine).union(*others)
    differing = sorted(k for k in keys if any(o.get(k, "—") != mine.get(k, "—") for o in others))
    shown = ", ".join(f"{k}={mine.get(k, '—')}" for k in differing[:2])
    more = f", +{len(differing) - 2} more" if len(differing) > 2 else ""
    return f"{name} ({shown}{more})"
