"""``opefo-node-check``: what this node must offer before a training rank starts on it.

Run by ``slurm/common.sh`` on the first task of every node; the checks are ``launch/node.py``'s.
Usage, checks and defaults: docs/cluster.md, section 8.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opefo_nemo.cli.preflight import compose_config
from opefo_nemo.cli.usage import OneLineParser
from opefo_nemo.launch import GIB, ModelShape, Problem
from opefo_nemo.launch.node import (
    GpuQuery,
    cache_directories,
    cache_problems,
    disk_problems,
    driver_problems,
    probe_environment,
    query_gpus,
    visible_gpu_problems,
)
from opefo_nemo.rollout.environment import rollout_python


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "").split("(")[0]  # Slurm writes "8(x4)" for repeated counts
    return int(value) if value else default


CHECKPOINT_BYTES_PER_PARAMETER = 14
"""bf16 weights (2) + fp32 main weights (4) + Adam's two fp32 moments (8)."""


@dataclass(frozen=True)
class ConfigSettings:
    """What the node check reads from the training config."""

    rollout_python: str | None = None
    output_dir: str | None = None
    checkpoint_bytes: int = 0


def config_settings(overrides: Sequence[str]) -> tuple[ConfigSettings, list[Problem]]:
    """``rollout.python``, ``run.output_dir`` and the disk the kept checkpoints need: the model's
    parameters × :data:`CHECKPOINT_BYTES_PER_PARAMETER` × (``checkpoint.keep`` + 1, a new
    checkpoint is written before the oldest goes); 0 when the model's ``config.json`` is not
    readable."""
    config, problems = compose_config(overrides)
    if config is None:
        return ConfigSettings(), problems
    try:
        parameters = ModelShape.from_model_dir(config["model"]["path"]).total_parameters()
    except (OSError, ValueError):
        parameters = 0
    keep = config["checkpoint"]["keep"]
    need = parameters * CHECKPOINT_BYTES_PER_PARAMETER * (keep + 1)
    return ConfigSettings(config["rollout"].get("python"), config["run"]["output_dir"], need), []


def _gpu_lines(args: argparse.Namespace, cuda_of: dict[str, str | None]) -> tuple[list, list]:
    if args.gpus == 0 and shutil.which("nvidia-smi") is None:
        return ["gpus: none expected (--gpus 0) and no nvidia-smi: driver checks skipped"], []
    query = query_gpus()
    if not isinstance(query, GpuQuery):
        return [], [query]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = visible if visible is not None else "(unset)"
    lines = [f"driver {query.driver}; {len(query.uuids)} GPU(s), CUDA_VISIBLE_DEVICES={shown}"]
    problems = driver_problems(query.driver, cuda_of)
    problems += visible_gpu_problems(query.uuids, visible, args.tasks_per_node)
    return lines, problems


def node_check(args: argparse.Namespace) -> list[str]:
    """The report's lines: what it found, then every problem on one line each; the last one is the
    verdict. Problems are lines starting with ``[``. ``--gpus`` (GPUs expected on the node)
    decides whether ``nvidia-smi`` must answer; with 0 the driver and GPU checks run only where
    ``nvidia-smi`` exists."""
    import torch

    settings, problems = config_settings(args.overrides)
    python = rollout_python(args.rollout_python or settings.rollout_python)
    lines = [f"node-check: {os.uname().nodename}, {args.tasks_per_node} task(s) per node"]
    lines.append(
        f"trainer: python {sys.executable}; torch {torch.__version__} "
        f"(CUDA {torch.version.cuda or 'none'}) from {Path(torch.__file__).parent}"
    )
    report, rollout_problems = probe_environment(python)
    problems += rollout_problems
    cuda_of = {f"the trainer's torch {torch.__version__}": torch.version.cuda}
    if report is not None and "path" in report["torch"]:
        torch_report, vllm_report = report["torch"], report["vllm"]
        lines.append(
            f"rollout: python {python}; torch {torch_report['version']} (CUDA "
            f"{torch_report['cuda'] or 'none'}) from {torch_report['path']}; vLLM "
            f"{vllm_report.get('version', '?')} from {vllm_report.get('path', '?')}"
        )
        cuda_of[f"the rollout environment's torch {torch_report['version']} ({python})"] = (
            torch_report["cuda"]
        )
    gpu_lines, gpu_problems = _gpu_lines(args, cuda_of)
    lines += gpu_lines
    problems += gpu_problems
    caches = cache_directories(dict(os.environ))
    lines.append("caches: " + ", ".join(f"{k}={v}" for k, v in caches.items()))
    problems += cache_problems(dict(os.environ))
    disk = Path(args.disk_path or settings.output_dir or ".")
    need = settings.checkpoint_bytes if args.min_free_gib is None else int(args.min_free_gib * GIB)
    lines.append(f"disk: {need / GIB:.1f} GiB needed where checkpoints go ({disk})")
    problems += disk_problems(disk, need)
    problems = list(dict.fromkeys(problems))
    lines += [str(problem) for problem in problems]
    lines.append(f"node-check: {len(problems)} problem(s)" if problems else "node-check: OK")
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="opefo-node-check", description=__doc__.split("\n\n")[0].split(": ", 1)[1]
    )
    parser.add_argument(
        "--tasks-per-node",
        type=int,
        default=_int_env("SLURM_NTASKS_PER_NODE", 1),
        help="training tasks on this node, one GPU each (default: $SLURM_NTASKS_PER_NODE or 1)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=_int_env("SLURM_GPUS_ON_NODE", 0),
        help="GPUs expected on this node (default: $SLURM_GPUS_ON_NODE or 0)",
    )
    parser.add_argument("--rollout-python", help="the rollout environment's interpreter")
    parser.add_argument("--disk-path", help="where checkpoints go (default: run.output_dir)")
    parser.add_argument(
        "--min-free-gib", type=float, help="free disk needed (default: the kept checkpoints')"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for opefo-train")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    lines = node_check(parse_args(argv))
    print("\n".join(lines), flush=True)
    return 0 if lines[-1] == "node-check: OK" else 1


if __name__ == "__main__":
    sys.exit(main())
