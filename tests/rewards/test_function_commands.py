"""``reward.function`` from the commands: ``opefo-train`` and ``opefo-probe`` (their ``main``, on
the tiny model generating itself) reward each response with a module of the user's own written
into tmp_path, run in the reward pool, and log what it returned; a name that imports nothing
stops ``opefo-train``, ``opefo-probe`` and ``opefo-eval`` with one line and exit 2, and is a
problem of ``opefo-preflight``'s report; ``opefo-eval`` scores its samples with it (vLLM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opefo_nemo.cli import eval as eval_cli
from opefo_nemo.cli import preflight as preflight_cli
from opefo_nemo.cli import probe as probe_cli
from opefo_nemo.cli import train as train_cli
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.trainer.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, RESPONSES_PER_PROMPT = 4, 4
#: The user's reward: the parity of the response's length (both outcomes occur in a batch of the
#: untrained tiny model's responses), with the length as an extra metric; every call recorded.
SOURCE = """
import json, multiprocessing, os

def parity(response, ground_truth):
    score = float(len(response) % 2)
    record = {{"score": score, "worker": multiprocessing.current_process().name}}
    with open(os.path.join({calls!r}, f"{{os.getpid()}}.jsonl"), "a") as out:
        out.write(json.dumps(record) + "\\n")
    return {{"score": score, "length": len(response)}}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", TinyModelSpec(), seed=0)


def user_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """``module:parity`` under a fresh module name, on ``sys.path``; and where its calls go."""
    calls = tmp_path / "calls"
    calls.mkdir()
    name = f"parity_reward_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SOURCE.format(calls=str(calls))))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:parity", calls


def recorded(calls: Path) -> list[dict]:
    return [json.loads(line) for path in calls.glob("*.jsonl") for line in path.open()]


def run_overrides(model: Path, function: str, out: Path) -> list[str]:
    return [
        "model=local",
        f"model.path={model}",
        "rollout=engine",
        f"reward.function={function}",
        "reward.workers=2",
        f"trainer.prompts_per_step={PROMPTS}",
        f"trainer.responses_per_prompt={RESPONSES_PER_PROMPT}",
        "rollout.max_new_tokens=12",
        "trainer.max_steps=1",
        "checkpoint.every=0",
        "metrics.progress=false",
        "metrics.tensorboard=false",
        f"run.output_dir={out}",
    ]


def assert_logged_as_returned(rollout: dict, calls: list[dict]) -> None:
    """The step's reward figures are those of the function's recorded calls, all in workers."""
    scores = [call["score"] for call in calls]
    assert len(scores) == PROMPTS * RESPONSES_PER_PROMPT
    assert {call["worker"] for call in calls} == {"opefo-reward"}
    assert 0 < sum(scores) < len(scores)  # both outcomes: the advantages are not all zero
    assert rollout["reward/mean"] == pytest.approx(sum(scores) / len(scores), rel=1e-6)
    assert rollout["reward/correct_frac"] == sum(s >= 1.0 for s in scores) / len(scores)
    assert rollout["reward/failed"] == 0.0
    assert rollout["reward/function/length"] > 0


def test_opefo_train_rewards_with_the_users_function(tiny, tmp_path, monkeypatch):
    function, calls = user_reward(tmp_path, monkeypatch)
    out = tmp_path / "run"
    assert train_cli.main(run_overrides(tiny, function, out)) == 0
    (step,) = read_metrics(out / "metrics.jsonl")
    assert_logged_as_returned(step, recorded(calls))


def test_opefo_probe_rewards_with_the_users_function(tiny, tmp_path, monkeypatch):
    function, calls = user_reward(tmp_path, monkeypatch)
    out = tmp_path / "probe"
    assert (
        probe_cli.main(["--json", str(out / "probe.json"), *run_overrides(tiny, function, out)])
        == 0
    )
    document = json.loads((out / "probe.json").read_text())
    assert_logged_as_returned(document["rollout"], recorded(calls))


@pytest.mark.slow  # a Python start, and the pool's workers each import the trainer
def test_the_opefo_train_command_finds_the_function_on_pythonpath(tiny, tmp_path, monkeypatch):
    """As a user runs it: the module found through ``PYTHONPATH`` by the command and by its
    reward workers; with a 1 s time limit, which a worker's own start-up (importing the
    command's modules, torch among them) must not eat into."""
    function, calls = user_reward(tmp_path, monkeypatch)
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "opefo_nemo.cli.train", *run_overrides(tiny, function, out)]
    done = subprocess.run(
        [*command, "reward.timeout_s=1"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (step,) = read_metrics(out / "metrics.jsonl")
    assert_logged_as_returned(step, recorded(calls))


@pytest.mark.vllm
@pytest.mark.slow  # a vLLM server starts
def test_opefo_eval_scores_with_the_users_function(tiny, tmp_path, monkeypatch):
    """``--reward-function``: each sample is correct exactly when the function scored it >= 1,
    recomputed here from the sample's text, and the table names the function."""
    function, calls = user_reward(tmp_path, monkeypatch)
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"{a}+1=", "answer": str(a + 1)}) + "\n"
                             for a in range(2)))  # fmt: skip
    out = tmp_path / "eval"
    args = [str(tiny), "--file", f"bench={bench}", "--samples", "4", "--reward-function", function]
    args += ["--max-new-tokens", "12", "--max-model-len", "64", "--out", str(out)]
    assert eval_cli.main(args) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(samples) == len(recorded(calls)) == 8
    assert [row["correct"] for row in samples] == [len(row["response"]) % 2 == 1 for row in samples]
    assert (out / "results.md").read_text().splitlines()[0] == f"avg@k, verifier {function}"


MISSING = "no_such_user_module.rewards:score"


def test_a_function_that_imports_nothing_stops_every_command(tiny, tmp_path, capsys):
    expected = f"reward.function={MISSING}: no module named 'no_such_user_module'"
    own = ["model=local", f"model.path={tiny}", f"reward.function={MISSING}"]
    for command in (train_cli, probe_cli):
        assert command.main([*own, f"run.output_dir={tmp_path / 'run'}"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].endswith(
            f"error: {expected} (put the directory that holds it on PYTHONPATH)"
        ), lines
    args = [str(tiny), "--reward-function", MISSING, "--file", f"a={tmp_path / 'a.jsonl'}"]
    assert eval_cli.main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--reward-function={MISSING}: no module named" in lines[0]
    assert preflight_cli.main([*own, f"run.output_dir={tmp_path / 'run'}"]) == 1
    report = capsys.readouterr().out.strip().splitlines()
    assert report[-2].startswith(f"[inputs] {expected}") and report[-1] == "preflight: 1 problem(s)"
    assert not (tmp_path / "run").exists()
