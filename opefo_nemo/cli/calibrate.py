"""``opefo-eval calibrate MODEL --pool SOURCE``: a hard-tail held-out set calibrated on MODEL
(spec §12): n samples of every problem of the pool, and the problems whose count of correct
samples falls in ``--band`` written as a held-out file in our JSONL schema, each with its count
(docs/boundary.md, "Calibrating a held-out set"; the files it writes: :func:`main`).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from opefo_nemo.cli import boundary_options as options
from opefo_nemo.cli.sample_counts import describe_generator
from opefo_nemo.cli.usage import OneLineParser
from opefo_nemo.data import Problem, load_jsonl, load_problems
from opefo_nemo.eval.calibration import Band, count_histogram, select, write_heldout
from opefo_nemo.eval.counts import CountsFile

log = logging.getLogger("opefo_nemo.eval")
PROG = "opefo-eval calibrate"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog=PROG,
        description="Draw n samples of every problem of a pool with MODEL and keep the problems "
        "whose count of correct samples falls in --band as a held-out file, each with its count "
        "(spec §12; docs/boundary.md).",
    )
    parser.add_argument("model", help="the starting model: a directory, checkpoint or policy/")
    parser.add_argument(
        "--pool",
        required=True,
        help="the problems: a .jsonl file (our schema), a .parquet file (verl's layout), or "
        "data=OPTION, the problems the trainer's data=OPTION holds (conf/data/)",
    )
    parser.add_argument(
        "--split",
        default="validation",
        choices=("validation", "train"),
        help="with --pool data=OPTION: its data.validation or its data.train (default: validation)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="data.KEY=VALUE",
        help="with --pool data=OPTION: a data key as opefo-train takes it (repeatable), e.g. "
        "data.arithmetic.num_validation=500",
    )
    parser.add_argument(
        "--band",
        help="LOW-HIGH: keep the problems with LOW to HIGH correct of the n samples (default: "
        "1 to n/8, e.g. 1-16 of 128)",
    )
    parser.add_argument("--max-problems", type=int, help="only the first N problems of the pool")
    options.add_draw_options(parser, samples=128, out="outputs/calibration")
    return parser.parse_args(argv)


def load_pool(args: argparse.Namespace) -> list[Problem]:
    """The pool's problems (see ``--pool``), at most ``--max-problems``."""
    pool = str(args.pool)
    if pool.startswith("data="):
        problems = task_pool(pool, args.split, args.set, args.defective_rows)
    else:
        if args.set:
            raise ValueError(f"--set applies to --pool data=OPTION, not to a file ({pool})")
        if pool.endswith(".jsonl"):
            problems = load_jsonl(pool, defective=args.defective_rows)
        else:
            problems = load_problems(pool, defective=args.defective_rows)
    if args.max_problems is not None:
        if args.max_problems < 1:
            raise ValueError(f"--max-problems must be >= 1, got {args.max_problems}")
        problems = problems[: args.max_problems]
    return problems


def task_pool(pool: str, split: str, overrides: Sequence[str], defective: str) -> list[Problem]:
    """The problems of the trainer's ``data=OPTION`` with ``overrides``: its ``split``, a
    built-in task's held-out or training problems or the file it names."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.config.data import GENERATED_DATA
    from opefo_nemo.trainer.setup import generated_split

    for override in overrides:
        if not override.startswith("data."):
            raise ValueError(f"--set {override}: only data.* keys select a pool")
    data = compose([pool, *overrides])[0].data
    source = data.validation if split == "validation" else data.train
    if source is None:
        raise ValueError(f"--pool {pool}: its data.validation is null; use --split train")
    if source in GENERATED_DATA:
        return generated_split(source, data)[0 if split == "train" else 1]
    return load_problems(source, defective=defective)


def prepare(args: argparse.Namespace):
    """Every input check, before any sample is drawn: the model, the pool, the options."""
    from opefo_nemo.cli.eval import resolve_model
    from opefo_nemo.data.prompt_codec import PromptCodec

    options.check_draw_options(args)
    band_text = args.band if args.band is not None else f"1-{max(1, args.samples // 8)}"
    band = Band.parse(band_text, args.samples)
    model = resolve_model(args.model)
    problems = load_pool(args)
    codec = PromptCodec(model, args.template)
    prompts = [codec.encode(p) for p in problems]
    settings = options.draw_settings(args, model, codec, "calibrate")
    options.check_lengths(model, prompts, args, settings.generator)
    ids = [p.prompt_id for p in problems]
    described = settings.describe(model, args.samples, "calibrate")
    counts = CountsFile(Path(args.out) / "counts.jsonl", described, ids)
    return model, problems, prompts, band, settings, counts


def summary(args, model, problems, band, chosen, counts, settings, cost) -> dict:
    """``calibration.json``: what was drawn, the histogram, what was kept, what it cost."""
    histogram = Counter(c.correct for c in counts)
    return {
        "model": str(model),
        "pool": str(args.pool),
        "problems": len(problems),
        "samples": args.samples,
        "band": str(band),
        "selected": len(chosen),
        "heldout": str(Path(args.out) / "heldout.jsonl"),
        "histogram": {str(c): histogram[c] for c in sorted(histogram)},
        "generator": describe_generator(settings),
        "settings": settings.describe(model, args.samples, "calibrate"),
        "seed": args.seed,
        "cost": asdict(cost),
    }


def render(report: dict) -> str:
    """``calibration.md``."""
    lines = [
        "# Calibration",
        "",
        f"{report['model']} on {report['pool']}: {report['problems']} problems × "
        f"{report['samples']} samples (seed {report['seed']}, {report['generator']}).",
        "",
        f"Band {report['band']} correct of {report['samples']}: {report['selected']} of "
        f"{report['problems']} problems kept in {report['heldout']}.",
        "",
        "| correct samples | problems |",
        "| --- | --- |",
        *[f"| {c} | {count} |" for c, count in report["histogram"].items()],
        "",
        f"This run drew {report['cost']['samples']} samples ({report['cost']['tokens']} tokens) "
        f"in {report['cost']['seconds']:.1f} s after {report['cost']['startup_seconds']:.1f} s "
        "of start-up.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    """Calibrate; 2 with one line on stderr for bad input (before the draw, or for a ``--band``
    that selects nothing after it, whose counts are kept). In ``--out``: ``counts.jsonl`` (every
    problem's count, written as problems finish: the same command again draws only what is
    missing), ``heldout.jsonl``, ``calibration.md`` and ``calibration.json`` (the counts'
    histogram, the settings, what the draw cost)."""
    args = parse_args(argv)
    try:
        model, problems, prompts, band, settings, counts = prepare(args)
    except (ValueError, FileNotFoundError) as error:
        return options.refuse(PROG, error)
    drawn = options.draw_models(args, problems, prompts, settings, {"calibrate": (model, counts)})
    if drawn.exit_status is not None:
        return drawn.exit_status
    ordered = counts.ordered(len(problems))
    try:
        chosen = select(ordered, band)
    except ValueError as error:
        return options.refuse(PROG, error)
    out = Path(args.out)
    write_heldout(out / "heldout.jsonl", problems, chosen)
    report = summary(
        args, model, problems, band, chosen, ordered, settings, drawn.costs["calibrate"]
    )
    (out / "calibration.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    markdown = render(report)
    (out / "calibration.md").write_text(markdown, encoding="utf-8")
    print(markdown, end="")
    log.info("counts of every problem: %s (%s)", counts.path, count_histogram(ordered))
    return 0
