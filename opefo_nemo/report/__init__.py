"""The training report: the paper's figures and a summary table from any runs' ``metrics.jsonl``.

:func:`write_report` reads run directories (:mod:`.runs`), groups the seeds of one experiment,
draws ``report.png`` (:mod:`.figure`, panels in :mod:`.panels`, curves in :mod:`.aggregate`) and
writes ``summary.md`` (:mod:`.summary`). ``opefo-report`` and ``opefo-train``'s comparisons call it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opefo_nemo.report.aggregate import Curve, group_curve, moving_average
from opefo_nemo.report.figure import write_figure
from opefo_nemo.report.panels import PANELS, missing_metrics
from opefo_nemo.report.runs import Group, Run, RunDirectoryError, group_runs, load_run
from opefo_nemo.report.summary import write_summary

log = logging.getLogger(__name__)
SMOOTH = 10
WINDOW = 10


@dataclass(frozen=True)
class ReportFiles:
    png: Path
    summary: Path
    groups: tuple[Group, ...]


def write_report(
    run_dirs: Sequence[Path], out_dir: Path, smooth: int = SMOOTH, window: int = WINDOW
) -> ReportFiles:
    """Read every run of ``run_dirs``, then write ``out_dir/report.png`` and ``summary.md``.

    ``smooth``: the figure's moving-average width in steps (1 = none); ``window``: the summary's
    first / last step count. Raises :class:`RunDirectoryError` for a directory without a readable
    ``metrics.jsonl``, before anything is written.
    """
    runs = []
    for path in run_dirs:
        run = load_run(Path(path))
        log.info("read %s: %d steps (%s)", run.path, run.steps, run.describe())
        runs.append(run)
    groups = group_runs(runs)
    for group in groups:
        log.info("group %s: %d run(s), seeds %s", group.label, len(group.runs), list(group.seeds))
    missing = missing_metrics(runs)
    for run, keys in missing.items():
        log.warning("%s logged no %s: left out of those panels", run.path, ", ".join(keys))
    out_dir.mkdir(parents=True, exist_ok=True)
    png = write_figure(groups, missing, out_dir, smooth)
    summary = write_summary(groups, missing, out_dir, window, smooth)
    log.info("wrote %s and %s", png, summary)
    return ReportFiles(png, summary, tuple(groups))


__all__ = [
    "PANELS",
    "SMOOTH",
    "WINDOW",
    "Curve",
    "Group",
    "ReportFiles",
    "Run",
    "RunDirectoryError",
    "group_curve",
    "group_runs",
    "load_run",
    "moving_average",
    "write_report",
]
