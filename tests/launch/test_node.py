"""``opefo-node-check`` (``launch/node.py``): one test per problem it reports, each on real
inputs: a fake ``nvidia-smi`` on ``PATH`` (the only thing here that needs a GPU machine), a bare
virtual environment without vLLM, a cache path under a regular file, a free-space threshold above
what the disk has. References: NVIDIA's minimum drivers per CUDA major version (minor-version
compatibility: 450 for 11.x, 525 for 12.x, 580 for 13.x)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opefo_nemo.cli import node_check
from opefo_nemo.launch.node import (
    GpuQuery,
    cache_problems,
    disk_problems,
    driver_problems,
    probe_environment,
    query_gpus,
    visible_gpu_problems,
)

UUIDS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)]


def fake_nvidia_smi(directory: Path, driver: str, gpus: int, exit_code: int = 0, text: str = ""):
    """An ``nvidia-smi`` that answers ``--query-gpu=uuid,driver_version`` like the real one."""
    directory.mkdir(exist_ok=True)
    rows = "".join(f"{uuid}, {driver}\n" for uuid in UUIDS[:gpus])
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text or rows}\nEOF\nexit {exit_code}\n")
    script.chmod(0o755)
    return script


def test_driver_older_than_either_environments_cuda(tmp_path):
    query = query_gpus(str(fake_nvidia_smi(tmp_path, "535.104.05", 8)))
    assert query == GpuQuery("535.104.05", tuple(UUIDS))
    cuda = {"the rollout environment's torch 2.13.0+cu130": "13.0", "the trainer's torch": "12.8"}
    (problem,) = driver_problems(query.driver, cuda)
    assert problem.topic == "driver"
    assert "driver 535.104.05 is older than 580, the minimum for CUDA 13.0" in problem.message
    assert "OPEFO_VLLM_CUDA=12 containers/build.sh" in problem.message  # 535 runs CUDA 12
    assert "rollout environment's torch 2.13.0+cu130" in problem.message
    assert driver_problems("580.65.06", cuda) == []
    assert driver_problems("525.60.13", {"t": "12.8"}) == []
    assert len(driver_problems("470.82.01", {"t": "12.8", "u": "11.8"})) == 1
    assert driver_problems("470.82.01", {"cpu torch": None}) == []
    (too_old_for_12,) = driver_problems("470.82.01", {"u": "13.0"})  # the CUDA 12 pair no help
    assert "install a torch built for the CUDA this driver supports" in too_old_for_12.message


def test_nvidia_smi_that_fails_or_is_missing_is_one_problem(tmp_path):
    said = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    failing = fake_nvidia_smi(tmp_path, "", 0, exit_code=9, text=said)
    problem = query_gpus(str(failing))
    assert str(problem) == f"[gpus] {failing} failed (exit 9): {said}"
    missing = query_gpus(str(tmp_path / "no-such-nvidia-smi"))
    assert "is not on PATH" in str(missing)


def test_fewer_visible_gpus_than_tasks():
    uuids = tuple(UUIDS)
    assert visible_gpu_problems(uuids, None, 8) == []
    (problem,) = visible_gpu_problems(uuids, "0,1,2,3", 8)
    assert str(problem) == (
        "[gpus] 4 GPU(s) visible (CUDA_VISIBLE_DEVICES=0,1,2,3), but 8 training task(s) per "
        "node need one each: request them with --gres=gpu:8"
    )
    assert len(visible_gpu_problems(uuids[:2], None, 4)) == 1


def test_rollout_environment_without_vllm(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    report, problems = probe_environment(str(bare / "bin" / "python"))
    assert [p.topic for p in problems] == ["rollout"] * 3
    assert "cannot import torch: ModuleNotFoundError: No module named 'torch'" in str(problems[0])
    assert "cannot import vllm: ModuleNotFoundError: No module named 'vllm'" in str(problems[1])
    assert report["prefix"] == str(bare)
    _, problems = probe_environment(str(tmp_path / "no-python"))
    assert "cannot run" in str(problems[0])


def test_unwritable_cache_directory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {name: str(tmp_path / name) for name in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME")}
    env |= {"TRITON_CACHE_DIR": str(blocker / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    (problem,) = cache_problems(env)
    assert str(problem).startswith(f"[cache] TRITON_CACHE_DIR={blocker / 'triton'} is not writable")
    assert (tmp_path / "VLLM_CACHE_ROOT").is_dir()  # created, written to, left empty
    assert list((tmp_path / "VLLM_CACHE_ROOT").iterdir()) == []


def test_too_little_free_disk(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    target = tmp_path / "checkpoints" / "run"  # not created yet: its nearest ancestor counts
    (problem,) = disk_problems(target, free + (1 << 40))
    assert problem.topic == "disk" and f"free on {tmp_path} (checkpoints go to {target})" in str(
        problem
    )
    assert disk_problems(target, 1 << 20) == []


def _cli(monkeypatch, tmp_path, capsys, argv, *, driver="580.65.06", gpus=8, triton=None):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, driver, gpus)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, str(tmp_path / "cache" / name))
    monkeypatch.setenv("TRITON_CACHE_DIR", triton or str(tmp_path / "cache" / "triton"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    status = node_check.main([*argv, "--rollout-python", sys.executable])
    return status, capsys.readouterr().out.splitlines()


@pytest.mark.vllm
def test_cli_reports_every_problem_at_once(monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["--tasks-per-node", "4", "--gpus", "4", "--disk-path", str(tmp_path),
            "--min-free-gib", "1e9"]  # fmt: skip
    status, lines = _cli(monkeypatch, tmp_path, capsys, argv, gpus=2, triton=str(blocker / "t"))
    assert status == 1
    problems = [line for line in lines if line.startswith("[")]
    assert [p.split("]")[0] for p in problems] == ["[gpus", "[cache", "[disk"]
    assert lines[-1] == "node-check: 3 problem(s)"
    assert any(line.startswith("rollout: python ") and "vLLM 0.32" in line for line in lines)


@pytest.mark.vllm
def test_cli_healthy_node(monkeypatch, tmp_path, capsys):
    argv = ["--tasks-per-node", "8", "--gpus", "8", "--disk-path", str(tmp_path),
            "--min-free-gib", "0.001"]  # fmt: skip
    status, lines = _cli(monkeypatch, tmp_path, capsys, argv)
    assert (status, lines[-1]) == (0, "node-check: OK"), lines
    assert "driver 580.65.06; 8 GPU(s), CUDA_VISIBLE_DEVICES=(unset)" in lines


@pytest.mark.parametrize("rollout", ["engine", "vllm"])
def test_rollout_environment_checked_only_when_a_server_generates(
    monkeypatch, tmp_path, capsys, rollout
):
    # The default rollout interpreter is one that cannot run: only a run with a rollout server
    # (rollout=vllm) needs it, and only that run may report it.
    monkeypatch.setenv("OPEFO_VLLM_PYTHON", str(tmp_path / "no-python"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the driver checks are skipped
    argv = ["--gpus", "0", "--disk-path", str(tmp_path), "--min-free-gib", "0.001",
            f"rollout={rollout}", f"run.output_dir={tmp_path / 'out'}"]  # fmt: skip
    status = node_check.main(argv)
    lines = capsys.readouterr().out.splitlines()
    rollout_problems = [line for line in lines if line.startswith("[rollout")]
    if rollout == "engine":
        assert (status, lines[-1], rollout_problems) == (0, "node-check: OK", []), lines
        assert any("generated by the training engine" in line for line in lines)
    else:
        assert status == 1 and rollout_problems and "cannot run" in rollout_problems[0], lines
