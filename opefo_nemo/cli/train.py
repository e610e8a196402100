"""``opefo-train [override ...]``: train with NeMo-style Hydra overrides; with no argument, the
embedded demo (docs/training.md, "The embedded default"). :data:`USAGE` is its ``--help``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from opefo_nemo.cli.demo_targets import GRPO, OPEFO, write_targets
from opefo_nemo.cli.usage import cfg_request, config_choices
from opefo_nemo.config import conf_dir
from opefo_nemo.config.compose import compose
from opefo_nemo.config.train import TrainConfig
from opefo_nemo.engines.aligner import AlignerUnavailableError
from opefo_nemo.engines.startup import DeviceUnavailableError
from opefo_nemo.orchestration.ranks import RankLayoutError
from opefo_nemo.orchestration.rollout_guard import GuardedRollout
from opefo_nemo.report import write_report
from opefo_nemo.trainer.checkpoint import list_checkpoints
from opefo_nemo.trainer.inputs import INPUT_ERRORS, check_inputs
from opefo_nemo.trainer.setup import build_trainer, model_dir, start_rollout

USAGE = """``opefo-train [override ...]``: train with NeMo-style Hydra overrides.

With no argument it runs the embedded default: it builds (once) the default model, the tiny model
warm-started on the arithmetic task whose solutions may be written in several equally correct
orders (``model=tiny_arithmetic_orders``, docs/training.md), trains ``grpo_strict`` and ``opefo``
from that same start with that model's run settings, each generating with its own weights
(``rollout=engine``), and writes
``outputs/embedded/report.png`` and ``summary.md`` (the ``opefo-report`` of both runs), and
``outputs/embedded/targets.md`` (printed too): the demo's figures against its targets.

``run.compare=[m1,m2,...]`` trains each method into ``<run.output_dir>/<method>``;
``run.seeds=[s1,s2,...]`` trains each run once per seed into ``.../seed_<s>`` (with or without a
comparison); either way the runs share one rollout engine (with ``rollout=engine`` each run's
policy generates), start from the same model, and end with the report over all of them under
``run.output_dir``.

A run directory that holds a run is continued from its newest checkpoint
(``checkpoint.resume=auto``; ``fresh`` refuses such a directory instead). ``--cfg job`` prints the
resolved configuration and exits.
"""
"""What ``opefo-train --help`` prints before the configuration groups."""

EMBEDDED_DEFAULT = ("run.name=embedded", "run.compare=[grpo_strict,opefo]", "rollout=engine")
"""What the bare ``opefo-train`` adds to the configuration's defaults: the comparison, generated
by the trained model itself (no vLLM server to start; 0.3-0.4 s a step instead of vLLM's 1.0 on
two CPU cores, docs/studies/demo.md).
The model and its run settings are the defaults' (``conf/model/tiny_arithmetic_orders.yaml``)."""
#: The comparison whose figures are checked against the demo's targets (targets.md).
DEMO_METHODS = (GRPO, OPEFO)
#: Errors that describe the user's set-up (each names the path, key or engine): one line, no trace.
START_UP_ERRORS = (
    *INPUT_ERRORS,
    AlignerUnavailableError,
    DeviceUnavailableError,
    RankLayoutError,
)
log = logging.getLogger("opefo_nemo")


def train_one(overrides: Sequence[str], rollout: GuardedRollout | None = None) -> tuple[str, Path]:
    """Train the run ``overrides`` describe; returns its status and output directory.

    ``rollout``: a running rollout engine to reuse (left open); else one is started and closed.
    """
    config, config_dict = compose(overrides)
    output_dir = Path(config.run.output_dir)
    trainer = build_trainer(config, config_dict, output_dir, rollout)
    try:
        status = trainer.run()
    finally:
        if rollout is None:
            trainer.rollout.close()
    log.info(
        "%s: %s after %d steps; metrics in %s", config.run.name, status, trainer.step, output_dir
    )
    return status, output_dir


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison or seed sweep: its name, output directory and extra overrides."""

    name: str
    output_dir: Path
    overrides: tuple[str, ...]


def plan_runs(config: TrainConfig) -> list[PlannedRun]:
    """Every (method, seed) run of ``run.compare`` × ``run.seeds``, methods outermost.

    Directories: ``<run.output_dir>[/<method>][/seed_<s>]`` (the method level with
    ``run.compare``, the seed level with ``run.seeds``). Each run's overrides empty both lists and
    set its method, ``run.seed``, name and directory, so its ``config.yaml`` records them. With
    ``checkpoint.resume=latest`` (continuing a pre-empted sequence) a run that has no checkpoint
    yet starts from the beginning (``auto``); the others resume (a finished one has nothing left
    to do).
    """
    root = Path(config.run.output_dir)
    plans = []
    for method in config.run.compare or (None,):
        for seed in config.run.seeds or (None,):
            name = method or config.run.name
            out = root / method if method else root
            overrides = ["run.compare=[]", "run.seeds=[]"]
            if method:
                overrides.append(f"method={method}")
            if seed is not None:
                name, out = f"{name}_seed{seed}", out / f"seed_{seed}"
                overrides.append(f"run.seed={seed}")
            overrides += [f"run.name={name}", f"run.output_dir={out}"]
            if config.checkpoint.resume == "latest" and not list_checkpoints(out / "checkpoints"):
                overrides.append("checkpoint.resume=auto")
            plans.append(PlannedRun(name, out, tuple(overrides)))
    return plans


def compare(overrides: Sequence[str]) -> Path:
    """Train every run of :func:`plan_runs` from the same start (one shared vLLM rollout engine),
    then write the report over all of them under ``run.output_dir``; returns the PNG's path."""
    config, _ = compose(overrides)
    root = Path(config.run.output_dir)
    check_inputs(config, root)
    shared = config.rollout.name == "vllm"  # rollout=engine: each run's policy generates
    rollout = start_rollout(config, model_dir(config), lambda: iter(())) if shared else None
    run_dirs = []
    try:
        for plan in plan_runs(config):
            status, out = train_one([*overrides, *plan.overrides], rollout)
            if status != "done":
                raise SystemExit(f"{plan.name} was pre-empted; rerun the same command to resume")
            run_dirs.append(out)
    finally:
        if rollout is not None:
            rollout.close()
    files = write_report(run_dirs, root)
    log.info(
        "report: %s and %s (redraw: opefo-report %s --out %s)",
        files.png,
        files.summary,
        " ".join(str(d) for d in run_dirs),
        root,
    )
    return files.png


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(f"{USAGE}\n{config_choices()}\nconfiguration: {conf_dir()}/config.yaml")
        return 0
    args, print_config = cfg_request(args, "opefo-train")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    overrides = args or list(EMBEDDED_DEFAULT)
    try:
        config, config_dict = compose(overrides)
    except ValueError as error:  # a bad override or config: the message names it, no traceback
        print(f"opefo-train: error: {error}", file=sys.stderr)
        return 2
    if print_config:
        print(yaml.safe_dump(config_dict, sort_keys=False), end="")
        return 0
    try:
        if config.run.compare or config.run.seeds:
            png = compare(overrides)
            if not config.run.seeds and set(DEMO_METHODS) <= set(config.run.compare):
                print(write_targets(png.parent, DEMO_METHODS))
            return 0
        status, _ = train_one(overrides)
    except START_UP_ERRORS as error:  # a missing path, empty data, an unavailable engine
        print(f"opefo-train: error: {error}", file=sys.stderr)
        return 2
    return 0 if status in ("done", "preempted") else 1


if __name__ == "__main__":
    raise SystemExit(main())
