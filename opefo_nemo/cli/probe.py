"""``opefo-probe [--json PATH] [override ...]``: which regime is this run in? No training.

Samples one rollout batch of the configuration ``opefo-train`` would compose, runs one token-stats
pass and reports what ``prepare`` computes at step 1 for every ΔH estimator, with a verdict
(docs/training.md, "Which regime is my run in?"; the figures: probe/step.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opefo_nemo.cli.train import START_UP_ERRORS
from opefo_nemo.cli.usage import OneLineParser, config_choices
from opefo_nemo.config.compose import compose
from opefo_nemo.config.train import TrainConfig
from opefo_nemo.core.entropy_flow import ESTIMATORS
from opefo_nemo.probe.output import document, table, verdict
from opefo_nemo.probe.step import NothingToProbeError, ProbeResult, probe
from opefo_nemo.trainer.inputs import check_inputs
from opefo_nemo.trainer.setup import build_trainer

STAGES = 3 + len(ESTIMATORS)  # start-up, generation, token statistics, one prepare per estimator


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog="opefo-probe",
        description=__doc__.split("\n\n")[0],
        epilog="Any other argument is an opefo-train override, e.g. trainer.prompts_per_step=32.\n"
        + config_choices(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", type=Path, help="where to write the JSON document")
    parser.add_argument("overrides", nargs="*", help="opefo-train overrides (Hydra syntax)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    try:
        config, config_dict = _checked_config(args.overrides)
    except (ValueError, *START_UP_ERRORS) as error:
        return _refuse(error)
    try:
        result = _probe_one_batch(config, config_dict)
    except START_UP_ERRORS as error:
        return _refuse(error)
    except NothingToProbeError as error:
        return _refuse(error, status=1)
    if result is not None:
        _report(result, args, config)
    return 0


def _refuse(error: Exception, status: int = 2) -> int:
    """The command's one-line refusal of ``error``; returns the exit status."""
    print(f"opefo-probe: error: {error}", file=sys.stderr)
    return status


def _checked_config(overrides: Sequence[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The configuration ``opefo-train`` would compose, its inputs checked; several runs
    (``run.compare``, ``run.seeds``) refused with a ``ValueError``."""
    config, config_dict = compose(overrides)
    check_inputs(config, Path(config.run.output_dir))
    if config.run.compare or config.run.seeds:
        raise ValueError(
            "run.compare and run.seeds train several runs; the probe looks at one batch of one "
            "method: drop them"
        )
    return config, config_dict


def _probe_one_batch(config: TrainConfig, config_dict: dict[str, Any]) -> ProbeResult | None:
    """Start the model and the rollout servers, probe one batch and stop them, with a progress
    bar over the :data:`STAGES`; the result on the main rank, ``None`` on the others."""
    from tqdm import tqdm

    bar = tqdm(total=STAGES, desc="opefo-probe", disable=not config.metrics.progress, leave=False)
    begun: list[str] = []

    def stage(name: str) -> None:
        if begun:
            bar.update(1)
        begun.append(name)
        bar.set_description(name)

    with contextlib.closing(bar):
        stage("model and rollout servers")
        # a run's checkpoint is probed only when named (checkpoint.resume=latest or a path)
        resume = config.checkpoint.resume not in ("auto", "fresh")
        trainer = build_trainer(config, config_dict, Path(config.run.output_dir), resume=resume)
        try:
            result = probe(trainer, stage)
        finally:
            trainer.rollout.close()
            bar.update(1)
    return result if trainer.ranks.is_main else None


def _report(result: ProbeResult, args: argparse.Namespace, config: TrainConfig) -> None:
    """The JSON document (``--json``, else ``probe.json`` in the output directory), the table
    and the verdict."""
    settings = {
        "model.path": str(config.model.path),
        "method": config.method.name,
        "engine": config.engine.name,
        "rollout.temperature": config.rollout.temperature,
        "rollout.max_new_tokens": config.rollout.max_new_tokens,
        "run.seed": config.run.seed,
    }
    path = args.json or Path(config.run.output_dir) / "probe.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document(result, args.overrides, settings), indent=2) + "\n")
    print(table(result))
    print(f"\nverdict: {verdict(result)}")
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
