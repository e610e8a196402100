"""``opefo-report RUN_DIR [RUN_DIR ...] --out DIR``: the paper's figures and a summary table
(docs/training.md, "Comparing methods and seeds"); :data:`USAGE` is its ``--help``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from opefo_nemo.cli.usage import OneLineParser
from opefo_nemo.report import SMOOTH, WINDOW, RunDirectoryError, write_report

USAGE = """\
``opefo-report RUN_DIR [RUN_DIR ...] --out DIR``: the paper's figures and a summary table.

Reads each run directory's ``metrics.jsonl`` and ``config.yaml`` (written by ``opefo-train``),
draws runs of one method and equal settings as one group (mean and min–max band over seeds) and
writes ``DIR/report.png`` and ``DIR/summary.md`` (docs/training.md, "Comparing methods").
A run missing a metric is left out of that panel and named in ``summary.md``; a directory without
``metrics.jsonl`` is an error naming it (exit status 2).
"""
"""What ``opefo-report --help`` prints above its options."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="opefo-report", description=USAGE, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories")
    p.add_argument("--out", type=Path, required=True, help="where report.png and summary.md go")
    p.add_argument(
        "--smooth",
        type=_positive,
        default=SMOOTH,
        help=f"moving-average width of the figure's curves, in steps (default {SMOOTH}; 1 = none)",
    )
    p.add_argument(
        "--window",
        type=_positive,
        default=WINDOW,
        help=f"steps averaged for the summary's first / last figures (default {WINDOW})",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    seen = set()
    for run in args.runs:
        if run.resolve() in seen:
            print(f"opefo-report: error: run directory {run} is given twice", file=sys.stderr)
            return 2
        seen.add(run.resolve())
    try:
        files = write_report(args.runs, args.out, smooth=args.smooth, window=args.window)
    except RunDirectoryError as error:
        print(f"opefo-report: error: {error}", file=sys.stderr)
        return 2
    print(f"{files.png}\n{files.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
