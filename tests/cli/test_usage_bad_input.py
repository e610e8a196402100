"""Every command's start-up errors, run as the user runs them: exit code 2, exactly one line on
stderr naming the key and the fix, no traceback; and no message advises deleting a directory the
product did not create. Every command line of this module runs in one Python process started for
it (``commands_in_one_process.py``: each line through its command's ``main`` with its own file
descriptors 1 and 2), so the table costs one start of torch, not one per line.

The table holds the cases a new user meets first (a Hugging Face directory given as
``model.path`` without ``model=local``, a data file with the embedded model, a directory that
already holds a run, ...) and one argument error per command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opefo_nemo.tasks.embedded_model import SHIPPED

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def paths(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """A Hugging Face model directory (the session's tiny model), a run directory that holds a
    run, a megatron-style checkpoint (no Hugging Face model inside), an empty directory, and a
    copy of the demo's shipped warm start outside the cache (as a user keeps one)."""
    root = tmp_path_factory.mktemp("inputs")
    shutil.copytree(SHIPPED / "tiny_arithmetic_orders", root / "warm")
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    checkpoint = root / "megatron" / "checkpoints" / "step_000002"
    (checkpoint / "policy").mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 2}))
    (root / "empty").mkdir()
    return {
        "hf": tiny_model_dir,
        "run": run,
        "megatron": checkpoint,
        "empty": root / "empty",
        "warm": root / "warm",
        "root": root,
    }


OWN_MODEL = ["model=local", "model.path={hf}"]
#: The copied warm start with other warm-start settings than those it was made with.
OTHER_RECIPE = ["model.path={warm}", "model.warm_start.slip_rate=0.5"]
# (command, arguments with {hf}/{run}/... placeholders, what the line must say)
CASES = [
    ("train", ["model.path={hf}"], "add `model=local`"),
    ("train", ["data=dapo_math", "data.train={root}/x.parquet"], "add `model=local"),
    ("train", ["data=dapo_math", "data.train="], "data.train="),
    ("train", [*OWN_MODEL, "data=dapo_math", "data.train="], "data.train is empty"),
    ("train", [*OWN_MODEL, "data=dapo_math", "data.train={root}/x.parquet"], "x.parquet: no such"),
    ("train", [*OWN_MODEL, "data.defective_rows=drop"], "data.defective_rows"),
    ("train", ["model=local", "model.path={root}/missing"], "model.path="),
    ("train", ["model.path={root}/Qwen-typo"], "model=local model.path="),
    ("train", ["model.path={empty}"], "add `model=local`"),
    ("train", OTHER_RECIPE, "warm start made with other model.warm_start"),
    ("train", ["run.output_dir={run}", "checkpoint.resume=fresh"], "holds a run"),
    ("train", ["run.output_dir={empty}", "checkpoint.resume=latest"], "checkpoint.resume=auto"),
    ("train", ["checkpoint.resume="], "checkpoint.resume must be"),
    ("train", ["trainer.max_stepz=5"], "unknown key trainer.max_stepz"),
    ("train", ["method=opefoo"], "method/opefoo"),
    ("train", ["--cfg", "hydra"], "--cfg job"),
    ("probe", ["model.path={hf}"], "add `model=local`"),
    ("probe", ["data=dapo_math", "data.train={root}/x.parquet"], "add `model=local"),
    ("probe", ["run.compare=[opefo,grpo]"], "drop them"),
    ("probe", ["--bogus"], "unrecognized arguments: --bogus"),
    ("preflight", ["--world-size", "x"], "--world-size"),
    ("eval", ["{megatron}", "--file", "a={root}/a.jsonl"], "opefo-export"),
    ("eval", ["{root}/missing"], "does not exist"),
    ("eval", ["{hf}"], "nothing to evaluate"),
    ("eval", ["{hf}", "--bogus"], "unrecognized arguments"),
    ("export", ["{root}/missing", "--out", "{root}/out"], "does not exist"),
    ("export", ["{root}/missing"], "--out"),
    ("report", ["{root}/missing", "--out", "{root}/out"], "is not a directory"),
    ("report", [], "required"),
    ("node_check", ["--gpus", "x"], "--gpus"),
]  # fmt: skip


PREFLIGHT = [("preflight", ["model.path={hf}"]), ("preflight", [*OWN_MODEL])]
#: A warm start of other settings at ``model.path``, which training refuses, and the same copy
#: with the settings it was made with, which it trains from.
PREFLIGHT_WARM_START = [("preflight", OTHER_RECIPE), ("preflight", ["model.path={warm}"])]
CFG_JOB = ["model=local", "model.path={hf}", "trainer.max_steps=3"]


@pytest.fixture(scope="module")
def results(paths) -> dict[tuple[str, tuple[str, ...]], dict]:
    """``{(command, args): {"code", "stdout", "stderr"}}`` for every command line of this module
    (placeholders filled), all run in one Python process."""
    lines = [
        *[(c, a) for c, a, _ in CASES],
        *PREFLIGHT,
        *PREFLIGHT_WARM_START,
        ("train", ["--cfg", "job", *CFG_JOB]),
    ]
    filled = [(c, [arg.format(**paths) for arg in a]) for c, a in lines]
    cases, out = paths["root"] / "cases.json", paths["root"] / "results.json"
    cases.write_text(json.dumps(filled))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OPEFO_CACHE": str(paths["root"] / "cache"),  # the embedded model's place: never built
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "tests.cli.commands_in_one_process", str(cases), str(out)]
    done = subprocess.run(
        command, cwd=paths["root"], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {(c, tuple(a)): r for (c, a), r in zip(lines, json.loads(out.read_text()), strict=True)}


@pytest.mark.parametrize(
    ("command", "args", "says"), CASES, ids=[f"{c}:{' '.join(a)}" for c, a, _ in CASES]
)
def test_a_start_up_error_is_one_line_and_exit_2(results, paths, command, args, says):
    done = results[(command, tuple(args))]
    lines = done["stderr"].strip().splitlines()
    assert done["code"] == 2, done["stderr"][-2000:]
    assert len(lines) == 1, done["stderr"][-2000:]
    assert lines[0].startswith(f"opefo-{command.replace('_', '-')}: error: "), lines[0]
    assert says in lines[0] and "Traceback" not in done["stderr"]
    assert "delete" not in lines[0].lower()
    assert not (paths["root"] / "cache").exists(), "no embedded model is built for a bad input"


def test_preflight_reports_what_training_would_stop_on(results):
    """opefo-preflight runs opefo-train's model and data checks: the case that stops training is
    a problem (exit 1, its report's verdict line), not "preflight: OK"."""
    stops, fine = (results[(c, tuple(a))] for c, a in PREFLIGHT)
    assert stops["code"] == 1, stops["stdout"]
    assert "add `model=local`" in stops["stdout"]
    assert stops["stdout"].rstrip().endswith("preflight: 1 problem(s)")
    assert fine["code"] == 0 and fine["stdout"].rstrip().endswith("preflight: OK"), fine["stdout"]


def test_preflight_refuses_the_warm_start_training_refuses(results):
    """A warm start at ``model.path`` made with other settings stops ``opefo-train`` (the table
    above); preflight runs the same check and reports it, and passes the copy whose settings
    match."""
    stops, fine = (results[(c, tuple(a))] for c, a in PREFLIGHT_WARM_START)
    assert stops["code"] == 1, stops["stdout"]
    assert "warm start made with other model.warm_start" in stops["stdout"]
    assert stops["stdout"].rstrip().endswith("preflight: 1 problem(s)")
    assert fine["code"] == 0 and fine["stdout"].rstrip().endswith("preflight: OK"), fine["stdout"]


def test_cfg_job_prints_the_resolved_config(results, paths):
    """Hydra's ``--cfg job``: the resolved config of the overrides, as YAML, nothing trained."""
    import yaml

    from opefo_nemo.config.compose import compose

    done = results[("train", ("--cfg", "job", *CFG_JOB))]
    assert done["code"] == 0, done["stderr"]
    overrides = [arg.format(**paths) for arg in CFG_JOB]
    assert yaml.safe_load(done["stdout"]) == compose(overrides)[1]
