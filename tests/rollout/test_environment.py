"""Which interpreter and ``PYTHONPATH`` the rollout servers get (``rollout/environment.py``),
checked against this interpreter's real site-packages."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from opefo_nemo.rollout.environment import (
    VLLM_PYTHON_ENV,
    foreign_imports,
    rollout_python,
    server_pythonpath,
    site_directories,
)

TRAINER_SITE = os.path.realpath(Path(torch.__file__).parents[1])


def test_the_trainers_site_packages_are_among_its_site_directories():
    assert TRAINER_SITE in site_directories()


def test_server_pythonpath_keeps_a_checkout_and_drops_the_trainers_site_packages(tmp_path):
    checkout, other = str(tmp_path / "checkout"), str(tmp_path / "other")
    inherited = os.pathsep.join([other, TRAINER_SITE, os.path.join(TRAINER_SITE, "sub")])
    path = server_pythonpath(checkout, inherited, site_directories())
    assert path.split(os.pathsep) == [checkout, other]


def test_an_installed_package_root_is_not_put_on_the_servers_path(tmp_path):
    """A non-editable install: the package's parent directory *is* the trainer's site-packages."""
    assert server_pythonpath(TRAINER_SITE, None, site_directories()) == ""
    assert server_pythonpath(TRAINER_SITE, str(tmp_path), site_directories()) == str(tmp_path)


def test_rollout_python_is_the_configured_then_the_images_then_this_one(monkeypatch):
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    assert rollout_python(None) == sys.executable
    monkeypatch.setenv(VLLM_PYTHON_ENV, "/opt/vllm-venv/bin/python")
    assert rollout_python(None) == "/opt/vllm-venv/bin/python"
    assert rollout_python("/elsewhere/python") == "/elsewhere/python"


def _report(prefix: str, torch_path: str, vllm_path: str) -> dict:
    return {"python": f"{prefix}/bin/python", "prefix": prefix, "torch_path": torch_path,
            "vllm_path": vllm_path}  # fmt: skip


def test_foreign_imports_name_both_paths_only_across_environments(tmp_path):
    torch_path, vllm_path = os.path.join(TRAINER_SITE, "torch"), os.path.join(TRAINER_SITE, "vllm")
    # the trainer's own environment: nothing to separate
    assert (
        foreign_imports(_report(sys.prefix, torch_path, vllm_path), sys.prefix, [TRAINER_SITE])
        == []
    )
    other = str(tmp_path / "vllm-venv")
    own = os.path.join(other, "lib", "site-packages")
    problems = foreign_imports(_report(other, torch_path, vllm_path), sys.prefix, [TRAINER_SITE])
    assert len(problems) == 2
    assert f"torch is imported from {torch_path}" in problems[0] and other in problems[0]
    assert f"vllm is imported from {vllm_path}" in problems[1]
    mixed = _report(other, os.path.join(own, "torch"), vllm_path)
    assert [p.split(",")[0] for p in foreign_imports(mixed, sys.prefix, [TRAINER_SITE])] == [
        f"vllm is imported from {vllm_path}"
    ]
