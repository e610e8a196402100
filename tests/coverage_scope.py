"""Where the suite measures the vLLM servers' coverage: in ``tests/rollout``, the server's own
tests, only. Elsewhere the servers run the same code unmeasured, under a launcher of this
interpreter that drops coverage's hand-over variable, since a measured server starts and decodes
about 1.5× slower than an unmeasured one (docs/verification.md, "The gates of `make test`").
Gloo ranks, trainers and Slurm jobs stay measured everywhere: they are not started through the
launcher.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from opefo_nemo.rollout.environment import VLLM_PYTHON_ENV

ROOT = Path(__file__).resolve().parents[1]
#: The test folder whose vLLM servers are measured.
MEASURED_SERVERS = ROOT / "tests" / "rollout"
#: What coverage's ``patch = ["subprocess"]`` sets for every child Python process to measure
#: itself (pyproject.toml); a process started without it is not measured.
HANDOVER = "COVERAGE_PROCESS_CONFIG"
LAUNCHER = "python-unmeasured"


def measures_servers(test_path: Path) -> bool:
    """Whether the vLLM servers a test file starts are measured."""
    return MEASURED_SERVERS in Path(test_path).resolve().parents


def unmeasured_python(directory: Path, python: str = sys.executable) -> Path:
    """An executable in ``directory`` that runs ``python`` with its arguments, without
    :data:`HANDOVER` in its environment (nor in its children's)."""
    launcher = directory / LAUNCHER
    launcher.write_text(f'#!/bin/sh\nunset {HANDOVER}\nexec {shlex.quote(python)} "$@"\n')
    launcher.chmod(0o755)
    return launcher


def install_unmeasured_servers(environ: MutableMapping[str, str]) -> Path | None:
    """Under coverage, make a launcher in a new temporary directory the servers' default
    interpreter (``$OPEFO_VLLM_PYTHON``, which ranks, trainers and Slurm jobs inherit), and
    return the directory; a run that names its own rollout interpreter keeps it (None)."""
    if HANDOVER not in environ or VLLM_PYTHON_ENV in environ:
        return None
    directory = Path(tempfile.mkdtemp(prefix="opefo-unmeasured-"))
    environ[VLLM_PYTHON_ENV] = str(unmeasured_python(directory))
    return directory


def servers_unmeasured(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether servers started now would run under the launcher."""
    return Path(environ.get(VLLM_PYTHON_ENV, "")).name == LAUNCHER
