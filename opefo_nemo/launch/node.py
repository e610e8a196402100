"""What one node must offer before any training rank starts on it (``opefo-node-check``): driver,
GPUs, rollout environment, caches, disk. Each check returns
:class:`~opefo_nemo.launch.checks.LaunchProblem` s (one line each), never raises (docs/cluster.md,
section 8).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opefo_nemo.launch.checks import LaunchProblem
from opefo_nemo.rollout.environment import foreign_imports, server_pythonpath, site_directories

MIN_DRIVER_FOR_CUDA = {11: 450, 12: 525, 13: 580}
"""Minimum driver major version per CUDA major version: NVIDIA's minor-version compatibility
(docs.nvidia.com/deploy/cuda-compatibility, "Minor Version Compatibility", table 1). vLLM 0.32's
registry wheel pins torch 2.13 built for CUDA 13."""

CACHE_DIRECTORIES = {
    "VLLM_CACHE_ROOT": "~/.cache/vllm",
    "TRITON_CACHE_DIR": "~/.triton/cache",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_{user}",
    "XDG_CACHE_HOME": "~/.cache",
}
"""The cache each variable names, and where it goes when the variable is unset."""

_PROBE = """
import json, os, sys
out = {"python": sys.executable, "prefix": sys.prefix}
for name in ("torch", "vllm", "opefo_nemo.rollout.server"):
    try:
        module = __import__(name, fromlist=["_"])
        out[name] = {"version": getattr(module, "__version__", ""),
                     "path": os.path.dirname(module.__file__)}
    except Exception as error:
        out[name] = {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
if "path" in out["torch"]:
    import torch
    out["torch"]["cuda"] = torch.version.cuda
print(json.dumps(out))
"""


@dataclass(frozen=True)
class GpuQuery:
    """What ``nvidia-smi`` reported: the driver version and one id (UUID) per GPU it lists."""

    driver: str
    uuids: tuple[str, ...]


def parse_version(text: str) -> tuple[int, ...]:
    """``"535.104.05"`` → ``(535, 104, 5)``."""
    return tuple(int(part) for part in text.strip().split("."))


def query_gpus(nvidia_smi: str = "nvidia-smi") -> GpuQuery | LaunchProblem:
    """Ask ``nvidia-smi`` for the driver and the GPUs; a problem when it cannot answer."""
    command = [nvidia_smi, "--query-gpu=uuid,driver_version", "--format=csv,noheader"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return LaunchProblem("gpus", f"{nvidia_smi} is not on PATH: no NVIDIA driver on this node")
    except subprocess.TimeoutExpired:
        return LaunchProblem("gpus", f"{nvidia_smi} did not answer within 60 s")
    rows = [line.split(",") for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not rows or any(len(row) != 2 for row in rows):
        said = (result.stdout + result.stderr).strip().splitlines()
        return LaunchProblem(
            "gpus",
            f"{nvidia_smi} failed (exit {result.returncode}): {said[0] if said else 'no output'}",
        )
    return GpuQuery(rows[0][1].strip(), tuple(row[0].strip() for row in rows))


def driver_problems(driver: str, cuda_of: dict[str, str | None]) -> list[LaunchProblem]:
    """``driver`` against each environment's torch CUDA (``cuda_of``: what → version or None)."""
    problems = []
    for what, cuda in cuda_of.items():
        if not cuda:
            continue
        major = parse_version(cuda)[0]
        need = MIN_DRIVER_FOR_CUDA.get(major)
        if need is not None and parse_version(driver)[0] < need:
            fix = "install a torch built for the CUDA this driver supports"
            if major == 13 and parse_version(driver)[0] >= MIN_DRIVER_FOR_CUDA[12]:
                fix = (
                    "rebuild the image with its CUDA 12 rollout environment (OPEFO_VLLM_CUDA=12 "
                    "containers/build.sh: vLLM 0.19.1, torch 2.10.0+cu128; docs/cluster.md)"
                )
            problems.append(
                LaunchProblem(
                    "driver",
                    f"NVIDIA driver {driver} is older than {need}, the minimum for CUDA {cuda} "
                    f"that {what} was built for: upgrade the node's driver to >= {need}, or {fix}",
                )
            )
    return problems


def visible_gpu_problems(
    uuids: tuple[str, ...], visible: str | None, tasks_per_node: int
) -> list[LaunchProblem]:
    """Whether the GPUs this task sees (``nvidia-smi``'s ``uuids``, then ``visible``:
    ``CUDA_VISIBLE_DEVICES``) number at least
    ``tasks_per_node``: every training rank of the node needs its own."""
    count = len(uuids)
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip()])
    if count >= tasks_per_node:
        return []
    shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    return [
        LaunchProblem(
            "gpus",
            f"{count} GPU(s) visible{shown}, but {tasks_per_node} training task(s) per node need "
            f"one each: request them with --gres=gpu:{tasks_per_node}",
        )
    ]


def probe_environment(python: str) -> tuple[dict | None, list[LaunchProblem]]:
    """Run ``python`` as the rollout servers run it (their ``PYTHONPATH``) and report what it
    imports; problems when it cannot run or cannot import torch, vLLM or the rollout server, or
    imports them from the trainer's site-packages (``rollout/environment.py``)."""
    sites = site_directories()
    package_root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": server_pythonpath(package_root, os.environ.get("PYTHONPATH"), sites),
    }
    try:
        result = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, [LaunchProblem("rollout", f"rollout.python={python} cannot run: {error}")]
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return None, [LaunchProblem("rollout", f"rollout.python={python} failed: {tail}")]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    problems = [
        LaunchProblem(
            "rollout", f"rollout.python={python} cannot import {name}: {report[name]['error']}"
        )
        for name in ("torch", "vllm", "opefo_nemo.rollout.server")
        if "error" in report[name]
    ]
    if not problems:
        flat = {
            "python": report["python"],
            "prefix": report["prefix"],
            "torch_path": report["torch"]["path"],
            "vllm_path": report["vllm"]["path"],
        }
        problems += [LaunchProblem("rollout", p) for p in foreign_imports(flat, sys.prefix, sites)]
    return report, problems


def cache_directories(environ: dict[str, str]) -> dict[str, Path]:
    """The directory each of :data:`CACHE_DIRECTORIES` resolves to under ``environ``."""
    user = environ.get("USER") or getpass.getuser()
    return {
        name: Path(environ.get(name) or default.format(user=user)).expanduser()
        for name, default in CACHE_DIRECTORIES.items()
    }


def cache_problems(environ: dict[str, str]) -> list[LaunchProblem]:
    """Every cache directory vLLM, Triton and torch compile write can be created and written (a
    file is written and removed)."""
    problems = []
    for name, path in cache_directories(environ).items():
        try:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".opefo-node-check-"):
                pass
        except OSError as error:
            problems.append(
                LaunchProblem(
                    "cache", f"{name}={path} is not writable ({type(error).__name__}: {error})"
                )
            )
    return problems


def free_bytes(path: Path) -> tuple[Path, int]:
    """Free bytes on the file system of ``path`` (its nearest existing ancestor)."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    return existing, shutil.disk_usage(existing).free


def disk_problems(path: Path, min_free_bytes: int) -> list[LaunchProblem]:
    """Less than ``min_free_bytes`` free where checkpoints go."""
    existing, free = free_bytes(path)
    if free >= min_free_bytes:
        return []
    gib = 1 << 30
    return [
        LaunchProblem(
            "disk",
            f"{free / gib:.1f} GiB free on {existing} (checkpoints go to {path}), fewer than "
            f"the {min_free_bytes / gib:.1f} GiB the kept checkpoints need (--min-free-gib)",
        )
    ]
