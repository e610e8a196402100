"""Checkpoints: ``<dir>/step_<NNNNNN>/`` holding everything a resumed run needs.

* ``policy/``: the engine's model (a loadable Hugging Face directory), optimizer and scheduler;
* ``trainer_state.json``: step, data position, NaN streak, rollout restarts;
* ``rng.pt``: Python, NumPy and torch generator states;
* ``config.yaml``: the composed configuration of the run.

A checkpoint is written into a temporary sibling and renamed, so ``latest`` never points at a
half-written one; only the newest ``keep`` are kept.
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

from .protocols import Policy

_NAME = re.compile(r"^step_(\d{6,})$")
POLICY_SUBDIR = "policy"


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if _NAME.match(p.name) and (p / "trainer_state.json").is_file()
    ]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def save_checkpoint(
    root: Path, step: int, policy: Policy, state: dict[str, Any], config: dict[str, Any], keep: int
) -> Path:
    """Write the checkpoint of ``step`` (completed rollout steps) and prune old ones."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    staging = root / f".{final.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    policy.save(staging / POLICY_SUBDIR)
    (staging / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    rng = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    torch.save(rng, staging / "rng.pt")
    (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old)
    return final


def resolve_resume(resume: str, root: Path) -> Path:
    """``resume``: a checkpoint directory, or ``latest`` (the newest under ``root``)."""
    if resume == "latest":
        found = list_checkpoints(root)
        if not found:
            raise FileNotFoundError(f"checkpoint.resume=latest but {root} holds no checkpoint")
        return found[-1]
    path = Path(resume)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"checkpoint.resume={resume} is not a checkpoint directory")
    return path


def load_checkpoint(path: Path, policy: Policy) -> dict[str, Any]:
    """Restore the policy and the RNG states; return the trainer state (with ``step``)."""
    policy.load(path / POLICY_SUBDIR)
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return json.loads((path / "trainer_state.json").read_text())
