"""The trainer and its vLLM servers in two environments, as in the training image: the trainer
runs from this environment, the servers from the rollout environment
(``scripts/setup_rollout_env.sh``: its own torch and vLLM, opefo-nemo installed non-editable).

References: the directories each interpreter really imports from (its ``sys.prefix`` and this
process's site-packages), and the refit order of ``orchestration/refit.py``.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from opefo_nemo.config.compose import compose
from opefo_nemo.rollout import RolloutServerError, VLLMRolloutEngine
from opefo_nemo.rollout.environment import is_inside, site_directories
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer
from tests.rollout.rollout_env import rollout_venv
from tests.trainer.recording import RecordingRollout
from tests.trainer.small_run import run_overrides

pytestmark = pytest.mark.vllm

REFIT = [("wake", ("weights",)), "update_weights", ("wake", ("kv_cache",))]


def test_two_steps_with_servers_in_the_rollout_environment(warm_model, tmp_path):
    venv = rollout_venv()
    python = str(venv / "bin" / "python")
    out = tmp_path / "run"
    config, config_dict = compose(run_overrides(warm_model, out, [f"rollout.python={python}"]))
    trainer = build_trainer(config, config_dict, out)
    recording = trainer.rollout = RecordingRollout(trainer.rollout)
    try:
        (imported,) = recording.engine.engine.environments
        assert trainer.run() == "done"
    finally:
        recording.close()

    assert os.path.realpath(imported["prefix"]) == os.path.realpath(venv)
    trainer_sites = site_directories()
    for name in ("torch", "vllm"):
        path = imported[f"{name}_path"]
        assert is_inside(path, [os.path.realpath(venv)]), (name, path)
        assert not is_inside(path, trainer_sites), (name, path, trainer_sites)
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == [1, 2]
    assert recording.calls == ["generate", "sleep", *REFIT] * 2


def test_a_server_importing_the_trainers_torch_refuses_naming_both_paths(warm_model, tmp_path):
    """A rollout interpreter that reaches the trainer's site-packages by itself (here: its
    ``sitecustomize`` puts them first; in an image, a ``.pth`` file or a venv made with
    ``--system-site-packages``) must not start."""
    venv = rollout_venv()
    python = str(venv / "bin" / "python")
    trainer_site = os.path.dirname(os.path.dirname(torch.__file__))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {trainer_site!r})
        """)
    )
    with pytest.raises(RolloutServerError, match="refusing to start") as refused:
        VLLMRolloutEngine(
            warm_model,
            python=python,
            startup_timeout_s=120,
            extra_env={"PYTHONPATH": str(hook)},
            log_dir=tmp_path / "logs",
        )
    message = str(refused.value)
    for name in ("torch", "vllm"):
        assert f"{name} is imported from {os.path.join(trainer_site, name)}" in message
    assert any(
        f"but the rollout environment is {prefix} " in message
        for prefix in (str(venv), os.path.realpath(venv))
    ), message
