"""The sbatch scripts on a real single-node Slurm (no container: Debian has no pyxis/enroot).

``tests/slurm/slurm_cluster.sh`` installs Debian's Slurm and munge when missing, starts
``slurmctld`` and ``slurmd`` for this host from a temporary directory, and stops them by pid at
the end of the session. Skipped only when not root or without ``apt-get``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "slurm" / "slurm_cluster.sh"
SBATCH_TIMEOUT_S = 900
#: A probe under Slurm and one run directly differ only in threads, so in the order of their
#: fp32 sums: 64 roundings of each figure's terms (tests/metric_bounds.py) bound both.
PROBE_REL = 64 * 2.0**-24
#: The tiny model is built once per machine and shared with the trainer's own tests.
MODEL_CACHE = os.environ.get("OPEFO_CACHE", str(ROOT / ".cache" / "opefo"))

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def embedded_model() -> Path:
    """The model of ``+preset=tiny_cpu`` (the first task's), in place before any job starts: a
    copy of the shipped warm start, or a build of minutes on 2 cores where its recipe changed,
    which the jobs' time limit (and its USR1 warning) is not meant to cover."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.setup import embedded_model as build

    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPEFO_CACHE", MODEL_CACHE)
        return build(compose(["model=tiny_arithmetic"])[0])  # +preset=tiny_cpu's model


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory, embedded_model) -> Path:
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
        "OPEFO_CACHE": MODEL_CACHE,
        "SLURM_CONF": str(slurm_conf),
        "OPEFO_HOME": str(ROOT),
        "OPEFO_CONTAINER": "none",
        "OPEFO_DATA_DIR": str(work / "data"),
        "OPEFO_MODEL_DIR": str(work / "models"),
        "OPEFO_CKPT_DIR": str(work / "checkpoints"),
        "OPEFO_LOG_ROOT": str(work / "logs"),
    }


def _job_name(script: str) -> str:
    """The ``#SBATCH --job-name`` of ``slurm/<script>.sbatch`` (its .out file's prefix)."""
    header = (ROOT / "slurm" / f"{script}.sbatch").read_text()
    found = re.search(r"^#SBATCH --job-name=(\S+)$", header, re.MULTILINE)
    assert found, f"slurm/{script}.sbatch names no job"
    return found.group(1)


def _sbatch(
    env: dict[str, str],
    work: Path,
    sbatch_options: list[str],
    overrides: list[str],
    script: str = "opefo_7b",
):
    """``sbatch --wait slurm/<script>.sbatch`` from ``work``; returns (exit status, job id, the
    job's .out text)."""
    command = [
        "timeout",
        str(SBATCH_TIMEOUT_S),
        "sbatch",
        "--wait",
        "--parsable",
        "--nodes=1",
        "--gres=none",  # the scripts ask for --gres=gpu:8; this node has no GPU
        "--time=20",
        *sbatch_options,
        str(ROOT / "slurm" / f"{script}.sbatch"),
        *overrides,
    ]
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    job_id = result.stdout.strip().split(";")[0]
    assert job_id.isdigit(), result.stdout + result.stderr
    out = (work / f"slurm-{_job_name(script)}-{job_id}.out").read_text()
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
    assert "node-check: OK" in out and "preflight: OK" in out
    job_dir = tmp_path / "logs" / f"opefo-7b-{job_id}"
    # Each task got the job's --cpus-per-task (srun does not inherit it since Slurm 22.05;
    # slurm/common.sh exports SRUN_CPUS_PER_TASK). The count is the task's CPU binding
    # (task/affinity), read with nproc.
    # nproc is asked with OMP_NUM_THREADS unset: it would report that instead of the binding
    rank_log = (job_dir / "attempt-0" / "rank-0.log").read_text()
    assert ": 2 CPU(s) of its binding (--cpus-per-task 2)" in rank_log
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
    status, _, out = _sbatch(
        env, tmp_path, ["--ntasks-per-node=1", "--cpus-per-task=1"], ["+preset=tiny_cpu"]
    )
    assert status != 0
    assert f"OPEFO_DATA_DIR={tmp_path / 'no-data'} is not a readable directory" in out
    assert "preflight" not in out


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def test_usr1_checkpoints_requeues_and_resumes(slurm_conf, tmp_path):
    """The time-limit signal (Slurm's --signal=B:USR1, sent here with scancel --batch) makes the
    trainer checkpoint and exit, the job requeue itself, and the next attempt resume: in a
    run.output_dir of the user's own, started with checkpoint.resume=fresh (which the requeued
    attempt replaces, as it would refuse the directory the first attempt wrote)."""
    env = _job_env(slurm_conf, tmp_path)
    run_dir = tmp_path / "my-runs" / "opefo"
    command = [
        "timeout", str(SBATCH_TIMEOUT_S), "sbatch", "--wait", "--parsable", "--nodes=1",
        "--gres=none", "--time=20", "--ntasks-per-node=1", "--cpus-per-task=2",
        str(ROOT / "slurm" / "opefo_7b.sbatch"),
        "+preset=tiny_cpu", "trainer.max_steps=5", "checkpoint.every=100",
        f"run.output_dir={run_dir}", "checkpoint.resume=fresh",
    ]  # fmt: skip
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        job_id = job.stdout.readline().strip().split(";")[0]
        assert job_id.isdigit()
        metrics = run_dir / "metrics.jsonl"
        _wait_for(lambda: metrics.is_file() and metrics.read_text().strip(), 600, "step 1")
        scancel = ["scancel", "--signal=USR1", "--batch", job_id]
        subprocess.run(scancel, env=env, check=True)
        log_dir = tmp_path / "logs" / f"opefo-7b-{job_id}"
        # The requeued attempt starts on its own once Slurm's hold (the first attempt's credential
        # lifetime, AuthInfo=cred_expire in tests/slurm/slurm_cluster.sh) is over.
        assert job.wait(timeout=SBATCH_TIMEOUT_S) == 0
    finally:
        if job.poll() is None:
            job.kill()
    out = (tmp_path / f"slurm-opefo-7b-{job_id}.out").read_text()
    assert "USR1: time limit near" in out and f"requeueing job {job_id}" in out
    assert "attempt 1 continues its run.output_dir from the newest checkpoint" in out
    assert (log_dir / "attempt-1" / "rank-0.log").is_file()
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line]
    assert steps == [1, 2, 3, 4, 5], steps
    assert not (metrics.parent / "metrics.superseded.jsonl").exists()


def test_eval_sbatch_writes_its_results_under_the_checkpoint_directory(
    slurm_conf, embedded_model, tmp_path
):
    """Without --out, slurm/eval.sbatch's results go to $OPEFO_CKPT_DIR/<job name>-<job id> (the
    mounted checkpoint directory), not to the task's working directory."""
    env = _job_env(slurm_conf, tmp_path)
    bench = tmp_path / "data" / "arith.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"{a}+{a}=", "answer": str(2 * a)}) + "\n"
                             for a in (12, 34)))  # fmt: skip
    options = ["--file", f"arith={bench}", "--verifier", "arithmetic", "--samples", "2"]
    options += ["--max-new-tokens", "24", "--max-model-len", "256"]
    status, job_id, out = _sbatch(
        env, tmp_path, ["--ntasks-per-node=1", "--cpus-per-task=2"],
        [str(embedded_model), *options], script="eval",
    )  # fmt: skip
    assert status == 0, out
    results = tmp_path / "checkpoints" / f"opefo-eval-{job_id}"
    samples = [json.loads(line) for line in (results / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and (results / "results.md").is_file()
    assert not (tmp_path / "outputs").exists()


def test_paper_preset_trains_on_megatron_cpu_ranks(slurm_conf, tmp_path, monkeypatch):
    """``sbatch slurm/opefo_7b.sbatch`` with its own preset (``engine=megatron``: bf16 with fp32
    main weights, TP 2 × sequence parallel, distributed optimizer, colocated vLLM) on 2 CPU
    tasks. Overridden: the device (``engine.device=cpu``), and what a tiny model on CPU needs:
    2 steps of 4 prompts, 24-token responses (a worked two-digit sum), 64-token prompts (its
    positions end at 512), the raw template and the arithmetic verifier. The
    model is the embedded default's tiny Qwen2 (the preset's family, warm-started on arithmetic,
    so that rewards differ within a group and the gradient is not zero), saved where the preset
    looks for Qwen2.5-Math-7B; the data a DAPO-Math-17k-style parquet of arithmetic problems
    where the preset looks for it."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.tasks.arithmetic import make_problems
    from opefo_nemo.trainer.setup import embedded_model
    from tests.data.verl_parquet import write_verl_parquet

    env = _job_env(slurm_conf, tmp_path)
    monkeypatch.setenv("OPEFO_CACHE", env["OPEFO_CACHE"])  # the embedded model's only home
    cached = Path(env["OPEFO_CACHE"]) / "tiny_arithmetic"
    shutil.copytree(
        embedded_model(compose(["model=tiny_arithmetic", f"model.path={cached}"])[0]),
        tmp_path / "models" / "Qwen2.5-Math-7B",
    )
    problems, _ = make_problems(2, 64, 1, seed=7)  # the warm start's task (conf/data)
    write_verl_parquet(
        tmp_path / "data" / "dapo-math-17k.parquet",
        [(p.problem, p.ground_truth) for p in problems],
    )
    status, job_id, out = _sbatch(
        env,
        tmp_path,
        ["--ntasks-per-node=2", "--cpus-per-task=1"],
        [
            "engine.device=cpu",
            "trainer.max_steps=2",
            "trainer.prompts_per_step=4",
            "rollout.max_new_tokens=24",
            "data.template=raw",
            "data.max_prompt_tokens=64",
            "reward.verifier=arithmetic",
        ],
    )
    assert status == 0, out
    assert "preflight: OK" in out
    job_dir = tmp_path / "logs" / f"opefo-7b-{job_id}"
    assert "override=+preset=opefo_7b" in (job_dir / "job.txt").read_text()
    run_dir = tmp_path / "checkpoints" / f"opefo-7b-{job_id}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2], rows
    for row in rows:  # a real update: rewards differ, the gradient moved, the flow balanced
        assert 0 < row["reward/correct_frac"] < 1 and row["grad/norm"] > 0, row
        # Σ w ΔH with the fp32 weights 1 ± λ*: zero up to their rounding
        fp32_eps = 2.0**-23
        assert abs(row["flow/net_after_balance"]) <= fp32_eps * (row["flow/pos"] + row["flow/neg"])
    assert (run_dir / "checkpoints" / "step_000002" / "policy").is_dir()


def test_probe_sbatch_reports_what_a_direct_probe_reports(slurm_conf, tmp_path):
    """``sbatch slurm/probe.sbatch``: node check, preflight, then ``opefo-probe`` on the task: its
    table and verdict in the rank's log, its JSON under the job's output directory, nothing
    trained; the figures are those of ``opefo-probe`` run directly with the same overrides, bound
    to as many CPUs as the task (so with as many threads, in the trainer and in vLLM)."""
    from tests.metric_bounds import assert_metrics_close

    env = _job_env(slurm_conf, tmp_path)
    overrides = ["+preset=tiny_cpu", "trainer.prompts_per_step=8"]
    cpus = sorted(os.sched_getaffinity(0))[:2]
    status, job_id, out = _sbatch(
        env,
        tmp_path,
        ["--ntasks-per-node=1", f"--cpus-per-task={len(cpus)}"],
        overrides,
        script="probe",
    )
    assert status == 0, out
    assert "node-check: OK" in out and "preflight: OK" in out
    rank_log = tmp_path / "logs" / f"opefo-probe-{job_id}" / "attempt-0" / "rank-0.log"
    run_dir = tmp_path / "checkpoints" / f"opefo-probe-{job_id}"
    document = json.loads((run_dir / "probe.json").read_text())
    assert f"verdict: {document['verdict']}" in rank_log.read_text()
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()

    direct = tmp_path / "direct.json"
    command = ["opefo-probe", "--json", str(direct), *overrides, f"run.output_dir={tmp_path}/d"]
    probed = subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=SBATCH_TIMEOUT_S,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )
    assert probed.returncode == 0, probed.stdout + probed.stderr
    reference = json.loads(direct.read_text())
    assert document["estimators"].keys() == reference["estimators"].keys()
    for estimator, figures in reference["estimators"].items():
        assert_metrics_close(document["estimators"][estimator], figures, PROBE_REL)
    figures = {k: v for k, v in document["rollout"].items() if not k.startswith("time/")}
    want = {k: v for k, v in reference["rollout"].items() if not k.startswith("time/")}
    assert "reward/mean" in want and "reward/group_signal_frac" in want
    assert_metrics_close(figures, want, PROBE_REL)
