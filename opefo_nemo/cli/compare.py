"""``opefo-eval compare BASE MODEL [MODEL ...] --heldout FILE``: did training narrow the reasoning
boundary? Fresh samples of every model, pass@k for k = 1, 2, 4 … n/2, Δ(k) against BASE with its
paired-bootstrap interval, the problems only one solves, the distinct answers (spec §12;
docs/boundary.md, "Comparing two models"; the files it writes: :func:`main`).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from opefo_nemo.cli import boundary_options as options
from opefo_nemo.cli.sample_counts import (
    DrawSettings,
    describe_generator,
)
from opefo_nemo.cli.usage import OneLineParser
from opefo_nemo.data import Problem, load_problems
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.eval.boundary import boundary_ks
from opefo_nemo.eval.boundary_report import boundary_report, write_boundary_report
from opefo_nemo.eval.calibration import read_calibration
from opefo_nemo.eval.counts import CountsFile
from opefo_nemo.report.boundary_figure import write_boundary_figure
from opefo_nemo.trainer.checkpoint import CHECKPOINTS_SUBDIR, list_checkpoints

log = logging.getLogger("opefo_nemo.eval")
PROG = "opefo-eval compare"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog=PROG,
        description="pass@k of BASE and of each MODEL on fresh samples of the held-out problems, "
        "Δ(k) against BASE with paired-bootstrap 95 % intervals, the problems only one solves "
        "and the distinct answers per problem (spec §12; docs/boundary.md).",
    )
    parser.add_argument("base", help="model A, the reference: usually the starting model")
    parser.add_argument(
        "models",
        nargs="+",
        help="the models B compared with it: directories, checkpoints, or a run's output "
        "directory (each of its checkpoints)",
    )
    parser.add_argument("--heldout", required=True, help="the held-out problems (.jsonl/.parquet)")
    parser.add_argument("--names", help="comma-separated names of BASE and each model B")
    parser.add_argument(
        "--k-max", type=int, help="the largest k reported (default: the largest power of 2 <= n/2)"
    )
    parser.add_argument(
        "--resamples", type=int, default=10000, help="bootstrap resamples (default: 10000)"
    )
    parser.add_argument(
        "--bootstrap-seed", type=int, default=0, help="seed of the resamples (default: 0)"
    )
    options.add_draw_options(parser, samples=256, out="outputs/boundary")
    return parser.parse_args(argv)


def expand_models(paths: Sequence[str]) -> list[tuple[str, Path]]:
    """``(default name, model directory)`` of each path; a run's output directory (or its
    ``checkpoints/``) gives one per checkpoint, oldest first."""
    from opefo_nemo.cli.eval import resolve_model

    found = []
    for raw in paths:
        path = Path(raw)
        steps = list_checkpoints(path) or list_checkpoints(path / CHECKPOINTS_SUBDIR)
        if steps and not (path / "config.json").is_file():
            run = path.name if path.name != CHECKPOINTS_SUBDIR else path.parent.name
            found += [(f"{run}/{step.name}", resolve_model(step)) for step in steps]
        else:
            found.append((path.name or str(path), resolve_model(path)))
    return found


def model_names(defaults: Sequence[str], names: str | None) -> list[str]:
    """``--names`` (one per model, base first), else the default names made unique."""
    if names is not None:
        given = [name.strip() for name in names.split(",")]
        if len(given) != len(defaults) or len(set(given)) != len(given) or "" in given:
            raise ValueError(
                f"--names {names}: need {len(defaults)} distinct names (base first), "
                f"one per model: {', '.join(defaults)}"
            )
        return given
    out: list[str] = []
    for name in defaults:
        unique, index = name, 2
        while unique in out:
            unique, index = f"{name} ({index})", index + 1
        out.append(unique)
    return out


def check_same_tokenizer(
    base: PromptCodec, other: PromptCodec, prompts: list[list[int]], problems: list[Problem]
) -> None:
    """``other`` encodes every prompt as ``base`` does, with the same vocabulary: else the
    "same prompts" would be other token sequences, and the comparison meaningless."""
    same = base.tokenizer.get_vocab() == other.tokenizer.get_vocab() and all(
        other.encode(p) == ids for p, ids in zip(problems, prompts, strict=True)
    )
    if not same:
        raise ValueError(
            f"MODEL {other.model_dir}: its tokenizer differs from BASE's ({base.model_dir}), so "
            "the same prompts would be other tokens: compare checkpoints of one model"
        )


def prepare(args: argparse.Namespace):
    """Every input check, before any sample is drawn."""
    options.check_draw_options(args)
    if args.resamples < 1:
        raise ValueError(f"--resamples must be >= 1, got {args.resamples}")
    try:
        ks = boundary_ks(args.samples, args.k_max)
    except ValueError:
        largest = args.k_max
        raise ValueError(
            f"--k-max {largest}: pass@{largest} needs --samples >= {2 * largest} (spec §12 "
            f"reports k <= n/2) and k >= 1, got --samples {args.samples}"
        ) from None
    entries = expand_models([args.base, *args.models])
    names = model_names([name for name, _ in entries], args.names)
    models = dict(zip(names, (path for _, path in entries), strict=True))
    problems = load_problems(args.heldout, defective=args.defective_rows)
    base = PromptCodec(models[names[0]], args.template)
    prompts = [base.encode(p) for p in problems]
    for name in names[1:]:
        check_same_tokenizer(base, PromptCodec(models[name], args.template), prompts, problems)
    settings = options.draw_settings(args, models[names[0]], base, "compare")
    options.check_lengths(models[names[0]], prompts, args, settings.generator)
    ids = [p.prompt_id for p in problems]
    counts = {
        name: CountsFile(
            Path(args.out) / "counts" / f"{file_stem(name)}.jsonl",
            settings.describe(path, args.samples, "compare"),
            ids,
        )
        for name, path in models.items()
    }
    return ks, models, problems, prompts, settings, counts


def file_stem(name: str) -> str:
    """A model's name as a file name (``/`` and other odd characters as ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def machine() -> str:
    """The machine in a few words: the GPU, else the CPU model and its cores."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = "CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def report_settings(args: argparse.Namespace, settings: DrawSettings, models: dict) -> dict:
    """The settings the report names."""
    return {
        "heldout": str(args.heldout),
        "seed": args.seed,
        "temperature": settings.sampling.temperature,
        "top_p": settings.sampling.top_p,
        "max_new_tokens": settings.sampling.max_new_tokens,
        "template": settings.template,
        "scored by": settings.reward.function or settings.reward.verifier,
        "generator": describe_generator(settings),
        "models": {name: str(path) for name, path in models.items()},
    }


def main(argv: Sequence[str]) -> int:
    """Compare; 2 with one line on stderr for bad input, found before any sample is drawn. In
    ``--out``: ``counts/<model>.jsonl`` (written as problems finish; the same command again
    draws only what is missing, and a new ``--resamples`` or ``--bootstrap-seed`` draws
    nothing), ``boundary.md``, ``boundary.json`` (with every problem's counts) and
    ``boundary.png``."""
    args = parse_args(argv)
    try:
        ks, models, problems, prompts, settings, counts = prepare(args)
    except (ValueError, FileNotFoundError) as error:
        return options.refuse(PROG, error)
    each = {name: (path, counts[name]) for name, path in models.items()}
    drawn = options.draw_models(args, problems, prompts, settings, each)
    if drawn.exit_status is not None:
        return drawn.exit_status
    costs = drawn.costs
    report = boundary_report(
        {name: counts[name].ordered(len(problems)) for name in models},
        ks,
        args.resamples,
        args.bootstrap_seed,
        calibration=read_calibration(Path(args.heldout)) if args.heldout.endswith(".jsonl") else {},
        settings=report_settings(args, settings, models),
    )
    report["cost"] = {name: asdict(cost) for name, cost in costs.items()}
    out = Path(args.out)
    write_boundary_report(report, out)
    today = datetime.date.today().isoformat()
    caption = f"{Path(args.heldout).name}, seed {args.seed}; {today}, {machine()}"
    figure = write_boundary_figure(report, out, caption)
    log.info("wrote %s, %s, %s", out / "boundary.md", out / "boundary.json", figure)
    samples = sum(cost.samples for cost in costs.values())
    seconds = sum(cost.seconds + cost.startup_seconds for cost in costs.values())
    log.info("this run drew %d samples in %.1f s", samples, seconds)
    return 0
