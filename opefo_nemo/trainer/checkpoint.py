"""Checkpoints: ``<dir>/step_<NNNNNN>/`` holding everything a resumed run needs, written atomically
and never overwritten; :func:`resume_point` decides where a run begins (docs/training.md,
"Checkpoints, pre-emption, resume").
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from opefo_nemo.engines.protocols import Policy
from opefo_nemo.orchestration.ranks import SINGLE_PROCESS, LoopRanks

_NAME = re.compile(r"^step_(\d{6,})$")
POLICY_SUBDIR = "policy"
CHECKPOINTS_SUBDIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"


class ResumeError(Exception):
    """``run.output_dir`` and ``checkpoint.resume`` disagree (a start-up error, one line)."""


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and (path / "trainer_state.json").is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def rng_file(rank: int) -> str:
    """The RNG state file of ``rank`` inside a checkpoint."""
    return "rng.pt" if rank == 0 else f"rng_rank{rank}.pt"


def save_checkpoint(
    root: Path,
    step: int,
    policy: Policy,
    state: dict[str, Any],
    config: dict[str, Any],
    keep: int,
    ranks: LoopRanks = SINGLE_PROCESS,
) -> Path:
    """Write the checkpoint of ``step`` (completed rollout steps) and prune all but the newest
    ``keep``: ``policy/`` (the engine's model, optimizer and scheduler; every rank its part),
    ``trainer_state.json`` (step, data position, the method's state, NaN streak, rollout
    restarts), ``rng.pt`` (rank ``r > 0``: ``rng_rank<r>.pt``) and ``config.yaml``. Written into
    a temporary sibling and renamed, so ``latest`` never points at a half-written one; with
    several ranks rank 0 prepares the staging directory and renames it once all have finished."""
    final = root / checkpoint_name(step)
    staging = root / f".{final.name}.partial"
    if ranks.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    ranks.barrier()
    policy.save(staging / POLICY_SUBDIR)
    rng = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    torch.save(rng, staging / rng_file(ranks.rank))
    ranks.barrier()
    if ranks.is_main:
        (staging / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=1))
        (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        if final.exists():  # resume_point refuses a start behind a later checkpoint
            raise FileExistsError(f"{final} exists already: not overwriting a checkpoint")
        staging.rename(final)
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    ranks.barrier()
    return final


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory was written at (its ``trainer_state.json``)."""
    return int(json.loads((path / "trainer_state.json").read_text())["step"])


def holds_run(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a run's metrics or checkpoints."""
    metrics = output_dir / METRICS_FILE
    has_metrics = metrics.is_file() and bool(metrics.read_text().strip())
    return has_metrics or bool(list_checkpoints(output_dir / CHECKPOINTS_SUBDIR))


def resume_point(resume: str, output_dir: Path) -> Path | None:
    """The checkpoint a run starting into ``output_dir`` continues from (``None``: step 0).

    ``resume`` (``checkpoint.resume``): ``auto`` the newest checkpoint under
    ``<output_dir>/checkpoints`` if there is one, else step 0; ``fresh`` step 0, refusing a
    directory that holds a run; ``latest`` the newest checkpoint, which must exist; else a
    checkpoint directory, refused when ``output_dir`` holds a later checkpoint (continuing from
    the earlier one would overwrite the later ones' steps).
    """
    found = list_checkpoints(output_dir / CHECKPOINTS_SUBDIR)
    if resume == "auto":
        return found[-1] if found else None
    if resume == "fresh":
        if holds_run(output_dir):
            raise ResumeError(
                f"checkpoint.resume=fresh but run.output_dir={output_dir} holds a run: give a new "
                "run.output_dir, or drop checkpoint.resume=fresh to continue that run"
            )
        return None
    if resume == "latest":
        if not found:
            raise ResumeError(
                f"checkpoint.resume=latest but {output_dir / CHECKPOINTS_SUBDIR} holds no "
                "checkpoint: use checkpoint.resume=auto to start from step 0 when there is none"
            )
        return found[-1]
    path = Path(resume)
    if not (path / "trainer_state.json").is_file():
        raise ResumeError(
            f"checkpoint.resume={resume} is not a checkpoint directory (no trainer_state.json)"
        )
    step = checkpoint_step(path)
    later = [c for c in found if checkpoint_step(c) > step]
    if later:
        raise ResumeError(
            f"checkpoint.resume={resume} (step {step}) but run.output_dir={output_dir} holds the "
            f"later {later[-1].name}: give a new run.output_dir to branch off step {step}"
        )
    return path


def load_checkpoint(
    path: Path, policy: Policy, ranks: LoopRanks = SINGLE_PROCESS
) -> dict[str, Any]:
    """Restore the policy and this rank's RNG states; return the trainer state (with ``step``)."""
    policy.load(path / POLICY_SUBDIR)
    rng_path = path / rng_file(ranks.rank)
    if not rng_path.is_file():
        raise FileNotFoundError(
            f"{path} has no {rng_path.name}: it was written by a run with fewer ranks than "
            f"this one ({ranks.world_size})"
        )
    rng = torch.load(rng_path, weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return json.loads((path / "trainer_state.json").read_text())
