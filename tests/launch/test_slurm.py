"""The sbatch scripts on a real single-node Slurm (no container: Debian has no pyxis/enroot).

``tests/launch/slurm_cluster.sh`` installs Debian's Slurm and munge when missing, starts
``slurmctld`` and ``slurmd`` for this host from a temporary directory, and stops them by pid at
the end of the session. Skipped only when not root or without ``apt-get``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "launch" / "slurm_cluster.sh"
SBATCH_TIMEOUT_S = 900

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory) -> Path:
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root (daemons, munge)")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and apt-get is unavailable")
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(
        ["bash", str(CLUSTER), "start", str(state)], capture_output=True, text=True, timeout=600
    )
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield state / "slurm.conf"
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(state)], timeout=60, check=False)


def _job_env(slurm_conf: Path, work: Path) -> dict[str, str]:
    for name in ("data", "models"):
        (work / name).mkdir(exist_ok=True)
    venv_bin = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": f"{venv_bin}:{os.environ['PATH']}",
        "SLURM_CONF": str(slurm_conf),
        "OPEFO_HOME": str(ROOT),
        "OPEFO_CONTAINER": "none",
        "OPEFO_DATA_DIR": str(work / "data"),
        "OPEFO_MODEL_DIR": str(work / "models"),
        "OPEFO_CKPT_DIR": str(work / "checkpoints"),
        "OPEFO_LOG_ROOT": str(work / "logs"),
    }


def _sbatch(env: dict[str, str], work: Path, sbatch_options: list[str], overrides: list[str]):
    """``sbatch --wait`` from ``work``; returns (exit status, job id, the job's .out text)."""
    command = [
        "timeout",
        str(SBATCH_TIMEOUT_S),
        "sbatch",
        "--wait",
        "--parsable",
        "--nodes=1",
        "--gpus-per-node=0",
        "--time=20",
        *sbatch_options,
        str(ROOT / "slurm" / "opefo_7b.sbatch"),
        *overrides,
    ]
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    job_id = result.stdout.strip().split(";")[0]
    assert job_id.isdigit(), result.stdout + result.stderr
    out = (work / f"slurm-opefo-7b-{job_id}.out").read_text()
    return result.returncode, job_id, out


def test_sbatch_runs_the_trainer_in_no_container_mode(slurm_conf, tmp_path):
    env = _job_env(slurm_conf, tmp_path)
    status, job_id, out = _sbatch(
        env,
        tmp_path,
        ["--ntasks-per-node=1", "--cpus-per-task=2"],
        ["+preset=tiny_cpu", "trainer.max_steps=2"],
    )
    assert status == 0, out
    assert "preflight: OK" in out
    job_dir = tmp_path / "logs" / f"opefo-7b-{job_id}"
    assert (job_dir / "attempt-0" / "preflight.log").read_text().rstrip().endswith("preflight: OK")
    assert "override=+preset=tiny_cpu" in (job_dir / "job.txt").read_text()
    # The trainer wrote one metrics line per step into the job's output directory.
    metrics = tmp_path / "checkpoints" / f"opefo-7b-{job_id}" / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line]
    assert steps == [1, 2], steps


def test_impossible_layout_stops_at_preflight(slurm_conf, tmp_path):
    env = _job_env(slurm_conf, tmp_path)
    status, job_id, out = _sbatch(
        env,
        tmp_path,
        ["--ntasks-per-node=2", "--cpus-per-task=1"],
        ["+preset=tiny_cpu", "trainer.max_steps=2"],
    )
    assert status != 0, out
    assert "[layout] engine 'hf' trains in one process, but the allocation has 2 tasks" in out
    assert "preflight found problems" in out
    job_dir = tmp_path / "logs" / f"opefo-7b-{job_id}" / "attempt-0"
    assert not list(job_dir.glob("rank-*.log")), "nothing may launch after a failed preflight"


def test_missing_data_directory_fails_before_anything_runs(slurm_conf, tmp_path):
    env = {**_job_env(slurm_conf, tmp_path), "OPEFO_DATA_DIR": str(tmp_path / "no-data")}
    status, _, out = _sbatch(env, tmp_path, ["--ntasks-per-node=1"], ["+preset=tiny_cpu"])
    assert status != 0
    assert f"OPEFO_DATA_DIR={tmp_path / 'no-data'} is not a readable directory" in out
    assert "preflight" not in out
