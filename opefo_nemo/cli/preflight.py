"""``opefo-preflight``: check a training config against the allocation before any GPU work.

Composes the config as ``opefo-train`` does and prints the layout, the per-GPU memory table and
every problem found; imports neither NeMo nor vLLM. Usage, checks and defaults: docs/cluster.md,
section 7.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from opefo_nemo.cli.usage import OneLineParser
from opefo_nemo.engines.startup import startup_problems
from opefo_nemo.launch import GIB, Problem, all_problems, plan_memory
from opefo_nemo.launch.checks import colocated_placement, layout_of
from opefo_nemo.launch.from_config import plan_from_config
from opefo_nemo.launch.plan import LaunchPlan
from opefo_nemo.launch.table import memory_table


def _default_world_size() -> int:
    """``--world-size``'s default: ``$WORLD_SIZE``, else ``$SLURM_NTASKS``, else 1."""
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(name)
        if value:
            return int(value)
    return 1


def _default_gpus_per_node() -> int:
    """``--gpus-per-node``'s default (ranks per node; it decides where colocated vLLM servers
    go): ``$LOCAL_WORLD_SIZE``, else ``$SLURM_NTASKS_PER_NODE``, else 0 (every rank on one
    node)."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name)
        if value:
            return int(value)
    return 0


def _default_gpu_memory_gib() -> float:
    """``--gpu-memory-gib``'s default: the visible CUDA device's memory, else
    ``$OPEFO_GPU_MEMORY_GIB``, else 0 (a CPU run: no capacity check)."""
    try:
        import torch

        if torch.cuda.is_available():
            return _cuda_memory_gib()
    except ImportError:
        pass
    return float(os.environ.get("OPEFO_GPU_MEMORY_GIB", "0") or 0)


def _cuda_memory_gib() -> float:  # pragma: no cover
    """CUDA only: the memory of this machine's first GPU in GiB."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / GIB


def compose_config(overrides: Sequence[str]) -> tuple[dict[str, Any] | None, list[Problem]]:
    """The composed config as a plain dict, or ``None`` and the problem that stopped it.

    A Hydra error becomes one problem on one line: a misspelt key is named, a missing group
    option (a misspelt preset) is listed with the options that exist.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from opefo_nemo.config.compose import hydra_error_message
    from opefo_nemo.config.method import conf_dir

    try:
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            config = compose("config", overrides=list(overrides))
        data = OmegaConf.to_container(config, resolve=True, throw_on_missing=True)
    except HydraException as error:
        message = hydra_error_message(error)
        topic = "engine" if "'engine/" in message else "config"
        return None, [Problem(topic, f"cannot compose the config: {message}")]
    except (ValueError, FileNotFoundError) as error:
        return None, [Problem("config", f"cannot compose the config: {error}")]
    return cast("dict[str, Any]", data), []  # a composed config is a mapping of strings


def _corrects_update(config: dict[str, Any]) -> bool:
    """Whether ``method.name`` is a method that keeps ``∇θ H̄`` to correct its update (an
    unknown name: no; the validation reports it)."""
    from opefo_nemo.core.objectives import objective_class

    try:
        return objective_class(str((config.get("method") or {}).get("name"))).corrects_update
    except ValueError:
        return False


def validation_problems(config: dict[str, Any], plan: LaunchPlan) -> list[Problem]:
    """The trainer's own start-up validation and start-up rules
    (:func:`~opefo_nemo.engines.startup.startup_problems`, which ``trainer.setup.build_policy``
    raises), as problems instead of exceptions."""
    from opefo_nemo.config.train import TrainConfig

    try:
        validated = TrainConfig.from_mapping(config)
    except ValueError as error:
        return [Problem("config", str(error))]
    return [Problem("layout", line) for line in startup_problems(validated.engine, plan.shape)]


def input_problems(config: dict[str, Any]) -> list[Problem]:
    """The model, data and run-directory checks ``opefo-train`` starts with
    (:func:`~opefo_nemo.trainer.inputs.check_inputs`): its first problem, if any."""
    from opefo_nemo.config.train import TrainConfig
    from opefo_nemo.trainer.inputs import INPUT_ERRORS, check_inputs

    try:
        validated = TrainConfig.from_mapping(config)
    except ValueError:  # an invalid config: validation_problems reports it
        return []
    try:
        check_inputs(validated, Path(validated.run.output_dir))
    except INPUT_ERRORS as error:
        return [Problem("inputs", str(error))]
    return []


def preflight(
    overrides: Sequence[str], world_size: int, gpu_memory_bytes: int, gpus_per_node: int = 0
) -> list[str]:
    """The report's lines; the last one is the verdict. Problems are lines starting with ``[``."""
    lines = [
        f"preflight: world size {world_size}"
        + (f" ({gpus_per_node} per node)" if gpus_per_node else "")
        + ", GPU memory "
        + (f"{gpu_memory_bytes / GIB:.1f} GiB" if gpu_memory_bytes else "none (CPU)"),
        f"overrides: {' '.join(overrides) or '(none)'}",
    ]
    config, problems = compose_config(overrides)
    if config is not None:
        try:
            plan = plan_from_config(
                config, world_size, gpu_memory_bytes, gpus_per_node, _corrects_update(config)
            )
        except ValueError as error:
            problems.append(Problem("config", str(error)))
        else:
            problems += validation_problems(config, plan)
            problems += all_problems(plan)
            if not any(problem.topic == "paths" for problem in problems):  # else said already
                problems += input_problems(config)
            budget = plan.memory.max_tokens_per_micro_batch
            micro = (
                f"micro-batch {plan.micro_batch_size}"
                if budget is None
                else f"micro-batches of at most {budget} tokens"
            )
            lines.append(
                f"engine {plan.engine}: {plan.prompts_per_step} prompts × "
                f"{plan.responses_per_prompt} responses, {micro}, "
                f"sequence {plan.memory.sequence_length} tokens"
            )
            placement = colocated_placement(plan)
            if placement is not None:
                lines.append(
                    f"rollout: {placement.num_servers} colocated vLLM server(s), tensor parallel "
                    f"{placement.rollout_tp_size} each, on the training GPUs"
                )
            layout, estimate = layout_of(plan), plan_memory(plan)
            if layout is not None and estimate is not None:
                lines.append(memory_table(estimate, layout, gpu_memory_bytes))
            elif plan.shape is None:
                lines.append("memory: no estimate (the model's config.json is not readable yet)")
    problems = list(dict.fromkeys(problems))
    lines += [str(problem) for problem in problems]
    lines.append(f"preflight: {len(problems)} problem(s)" if problems else "preflight: OK")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="opefo-preflight", description=__doc__.split("\n\n")[0].split(": ", 1)[1]
    )
    parser.add_argument("--world-size", type=int, default=None, help="ranks of the allocation")
    parser.add_argument(
        "--gpus-per-node", type=int, default=None, help="ranks per node (0: all on one node)"
    )
    parser.add_argument(
        "--gpu-memory-gib", type=float, default=None, help="memory of one GPU (0: CPU run)"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for opefo-train")
    args = parser.parse_args(argv)
    world_size = args.world_size if args.world_size is not None else _default_world_size()
    gib = args.gpu_memory_gib if args.gpu_memory_gib is not None else _default_gpu_memory_gib()
    per_node = args.gpus_per_node if args.gpus_per_node is not None else _default_gpus_per_node()
    lines = preflight(args.overrides, world_size, int(gib * GIB), per_node)
    print("\n".join(lines), flush=True)
    return 0 if lines[-1] == "preflight: OK" else 1


if __name__ == "__main__":
    sys.exit(main())
