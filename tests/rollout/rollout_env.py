"""Where the rollout environment (``scripts/setup_rollout_env.sh``) is, for the tests that start
the trainer in one environment and its vLLM servers in the other."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def rollout_venv() -> Path:
    """The rollout environment's directory; the test is skipped, saying how to build it, when
    it has not been built (``make test`` builds it first)."""
    venv = Path(os.environ.get("OPEFO_ROLLOUT_VENV", ROOT / ".venv-rollout"))
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no rollout environment at {venv}: run scripts/setup_rollout_env.sh")
    return venv
