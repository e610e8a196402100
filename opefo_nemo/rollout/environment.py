"""Which Python the vLLM servers run under, what their ``PYTHONPATH`` holds, and where they
imported torch and vLLM from (docs/rollout.md, "The rollout environment"). Standard library only:
the server imports this before torch and vLLM.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

VLLM_PYTHON_ENV = "OPEFO_VLLM_PYTHON"
"""The environment variable naming the rollout environment's interpreter (set by the image)."""


def rollout_python(configured: str | None) -> str:
    """The interpreter the servers run under: ``configured``, else ``$OPEFO_VLLM_PYTHON``, else
    this process's own."""
    return configured or os.environ.get(VLLM_PYTHON_ENV) or sys.executable


def site_directories() -> list[str]:
    """This interpreter's site-packages directories (global, user, and the venv's), resolved."""
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    paths.update(getattr(site, "getsitepackages", list)())
    if site.ENABLE_USER_SITE:
        paths.add(site.getusersitepackages())
    return sorted({os.path.realpath(p) for p in paths})


def is_inside(path: str | os.PathLike, directories: Iterable[str]) -> bool:
    """Whether ``path`` (resolved) is one of ``directories`` or lies below one."""
    resolved = Path(os.path.realpath(path))
    return any(resolved == Path(d) or Path(d) in resolved.parents for d in directories)


def server_pythonpath(package_root: str, inherited: str | None, excluded: Iterable[str]) -> str:
    """The servers' ``PYTHONPATH``: ``package_root`` (the directory holding ``opefo_nemo``) first
    when it is not inside ``excluded`` (the trainer's site-packages), then the ``inherited``
    entries that are not inside them either."""
    excluded = list(excluded)
    entries = [package_root] + [p for p in (inherited or "").split(os.pathsep) if p]
    kept: list[str] = []
    for entry in entries:
        if entry not in kept and not is_inside(entry, excluded):
            kept.append(entry)
    return os.pathsep.join(kept)


def imported_from() -> dict[str, str | None]:
    """Where this interpreter imports torch and vLLM from, and their versions (imports both)."""
    import torch
    import vllm

    return {
        "python": sys.executable,
        "prefix": sys.prefix,
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_path": str(Path(torch.__file__).parent),
        "vllm_version": vllm.__version__,
        "vllm_path": str(Path(vllm.__file__).parent),
    }


def foreign_imports(
    report: dict[str, str | None], trainer_prefix: str, trainer_sites: Iterable[str]
) -> list[str]:
    """Why a server with ``report`` (:func:`imported_from`) must not run: torch or vLLM taken
    from the trainer's site-packages although the server runs in another environment. Empty
    when the server shares the trainer's environment (nothing to separate) or all is well."""
    if os.path.realpath(str(report["prefix"])) == os.path.realpath(trainer_prefix):
        return []
    trainer_sites = list(trainer_sites)
    return [
        f"{name} is imported from {report[f'{name}_path']}, inside the trainer's environment "
        f"({trainer_prefix}), but the rollout environment is {report['prefix']} "
        f"(interpreter {report['python']}): its PYTHONPATH reaches the trainer's site-packages"
        for name in ("torch", "vllm")
        if is_inside(str(report[f"{name}_path"]), trainer_sites)
    ]


def describe(report: dict[str, str | None]) -> str:
    """One line for the log: the interpreter, torch (with its CUDA) and vLLM, with paths."""
    cuda = report["torch_cuda"] or "none"
    return (
        f"python {report['python']}; torch {report['torch_version']} (CUDA {cuda}) from "
        f"{report['torch_path']}; vLLM {report['vllm_version']} from {report['vllm_path']}"
    )
