"""The suite's scope for measuring vLLM servers (tests/coverage_scope.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from opefo_nemo.rollout.environment import VLLM_PYTHON_ENV
from tests.coverage_scope import (
    HANDOVER,
    ROOT,
    install_unmeasured_servers,
    measures_servers,
    servers_unmeasured,
    unmeasured_python,
)

SHOW = f"import os, sys; print(os.environ.get({HANDOVER!r}), sys.prefix, sys.argv[1:])"


def test_the_launcher_runs_this_interpreter_without_the_hand_over(tmp_path):
    launcher = unmeasured_python(tmp_path)
    env = {**os.environ, HANDOVER: "[run]"}
    shown = subprocess.run(
        [str(launcher), "-c", SHOW, "a b", "c"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split(" ", 2) == ["None", sys.prefix, "['a b', 'c']\n"]
    direct = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True)
    assert direct.stdout.split(" ", 1)[0] == "[run]"  # what the launcher takes away


def test_the_launcher_is_installed_under_coverage_unless_an_interpreter_is_named():
    assert install_unmeasured_servers({}) is None  # not under coverage
    named = {HANDOVER: "[run]", VLLM_PYTHON_ENV: "/opt/vllm-venv/bin/python"}
    assert install_unmeasured_servers(named) is None
    assert named[VLLM_PYTHON_ENV] == "/opt/vllm-venv/bin/python"
    environ = {HANDOVER: "[run]"}
    directory = install_unmeasured_servers(environ)
    try:
        assert directory is not None and servers_unmeasured(environ)
        assert os.access(environ[VLLM_PYTHON_ENV], os.X_OK)
    finally:
        shutil.rmtree(directory)


def test_servers_are_measured_under_tests_rollout_only():
    assert measures_servers(ROOT / "tests" / "rollout" / "test_client_vllm.py")
    assert not measures_servers(ROOT / "tests" / "trainer" / "test_loop_vllm.py")
    assert not measures_servers(ROOT / "tests" / "rollout_helpers.py")


@pytest.mark.skipif(HANDOVER not in os.environ, reason="only under coverage (make coverage)")
def test_under_coverage_this_module_starts_its_servers_unmeasured():
    assert servers_unmeasured()
