"""A reward function of the user's own (``reward.function``), from a module written into tmp_path
outside the package: loading errors name the key in one line; in the trainer process and in the
worker pool it scores what the function returns, under the built-in verifiers' time limit and
error accounting."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from opefo_nemo.config.reward import RewardConfig
from opefo_nemo.rewards import ScoringConfig, score_batch
from opefo_nemo.rewards.function import RewardFunctionError, load_reward_function, read_reward
from opefo_nemo.trainer.scoring import reason_metrics, score_responses

#: The user's module: a reward by the count of the ground truth in the response, with extra
#: metrics; responses named after a failure make it fail that way.
SOURCE = """
import multiprocessing, os, time

def count(response, ground_truth):
    if response == "raise":
        raise RuntimeError("the user's bug")
    if response == "sleep":
        time.sleep(60)
    if response == "nan":
        return float("nan")
    if response == "text":
        return "1"
    if response == "no score":
        return {"hits": 1}
    hits = response.count(ground_truth)
    if response.startswith("plain"):
        return hits
    return {
        "score": float(hits),
        "length": len(response),
        "in_worker": multiprocessing.current_process().name == "opefo-reward",
        "pid": os.getpid(),
    }

not_callable = 3

def one_argument(response):
    return 0.0
"""


def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str = SOURCE) -> str:
    """A module under a fresh name (imports are cached per process), on ``sys.path``."""
    name = f"user_reward_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


RESPONSES = ["7 and 7", "plain 7", "no digit", "raise", "nan", "text", "no score", "77 7"]
TRUTHS = ["7"] * len(RESPONSES)
#: (score, reason) of each response, by the rule above; failures score the incorrect score.
EXPECTED = [
    (2.0, "correct"),
    (1.0, "correct"),
    (0.0, "wrong"),
    (-0.5, "error"),
    (-0.5, "error"),
    (-0.5, "error"),
    (-0.5, "error"),
    (3.0, "correct"),
]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_function_scores_in_process_and_in_the_pool(tmp_path, monkeypatch, workers):
    module = user_module(tmp_path, monkeypatch)
    config = ScoringConfig(function=f"{module}:count", incorrect_score=-0.5, timeout_s=5.0)
    results = score_batch(RESPONSES, TRUTHS, config=config, workers=workers)
    assert [(r.score, r.reason) for r in results] == EXPECTED
    assert results[0].metrics["length"] == len(RESPONSES[0])
    assert results[1].metrics == {}  # a plain number: no extra metrics
    in_worker = {r.metrics["in_worker"] for r in results if "in_worker" in r.metrics}
    assert in_worker == {float(workers > 0)}
    if workers:  # the pool's processes, not this one
        assert os.getpid() not in {r.metrics["pid"] for r in results if r.metrics}


@pytest.mark.parametrize("workers", [0, 1])
def test_a_slow_call_times_out_like_a_verifier(tmp_path, monkeypatch, workers):
    """The soft limit in process, the soft then hard limit in a worker: ``timeout``, the
    incorrect score, and the items after it still scored."""
    module = user_module(tmp_path, monkeypatch)
    config = ScoringConfig(function=f"{module}:count", timeout_s=0.5)
    results = score_batch(["sleep", "7"], ["7", "7"], config=config, workers=workers)
    assert [(r.score, r.reason) for r in results] == [(0.0, "timeout"), (1.0, "correct")]


def test_the_import_is_not_charged_to_the_first_response(tmp_path, monkeypatch):
    """A module that takes longer to import than the time limit (a heavy dependency) still
    scores its first response: the limit runs from the call, not from the import."""
    slow = user_module(tmp_path, monkeypatch, "import time\ntime.sleep(1.0)\n" + SOURCE)
    config = ScoringConfig(function=f"{slow}:count", timeout_s=0.5)
    results = score_batch(["7", "7 7"], ["7", "7"], config=config, workers=0)
    assert [(r.score, r.reason) for r in results] == [(1.0, "correct"), (2.0, "correct")]


def test_the_trainer_scores_with_the_function_and_logs_its_metrics(tmp_path, monkeypatch):
    """``reward.function`` replaces ``reward.verifier``; each extra metric is logged as its mean
    over the responses that reported it, and failures count in ``reward/failed``."""
    module = user_module(tmp_path, monkeypatch)
    settings = RewardConfig(verifier="dapo", function=f"{module}:count", incorrect_score=-1.0)
    results = score_responses(RESPONSES, TRUTHS, settings)
    assert [r.score for r in results] == [-1.0 if s == -0.5 else s for s, _ in EXPECTED]
    metrics = reason_metrics(results)
    lengths = [len(r) for r in RESPONSES if r in ("7 and 7", "no digit", "77 7")]
    assert metrics["reward/function/length"] == sum(lengths) / len(lengths)
    assert metrics["reward/failed"] == 4.0
    assert metrics["reward/correct_frac"] == 3 / len(RESPONSES)


def test_a_returned_value_is_a_number_or_a_mapping_with_a_score():
    assert read_reward(True) == (1.0, {})
    assert read_reward({"score": 0.5, "format": False}) == (0.5, {"format": 0.0})
    for bad in ("1", None, float("inf"), {"hits": 1}, {"score": 1.0, "note": "text"}):
        with pytest.raises((TypeError, ValueError)):
            read_reward(bad)


@pytest.mark.parametrize(
    ("attribute", "says"),
    [
        ("missing", "has no 'missing'"),
        ("not_callable", "not_callable is not callable"),
        ("one_argument", "called as one_argument(response, ground_truth)"),
    ],
)
def test_a_name_that_leads_nowhere_is_one_line_naming_the_key(
    tmp_path, monkeypatch, attribute, says
):
    module = user_module(tmp_path, monkeypatch)
    with pytest.raises(RewardFunctionError) as caught:
        load_reward_function(f"{module}:{attribute}")
    message = str(caught.value)
    assert message.startswith(f"reward.function={module}:{attribute}: ") and says in message
    assert "\n" not in message


def test_a_missing_module_or_a_failing_import_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(
        RewardFunctionError, match=r"no module named 'no_such_reward_module'.*PYTHONPATH"
    ):
        load_reward_function("no_such_reward_module.inner:f", "--reward-function")
    broken = user_module(tmp_path, monkeypatch, "import no_such_dependency_of_the_user\n")
    with pytest.raises(RewardFunctionError) as caught:
        load_reward_function(f"{broken}:f")
    message = str(caught.value)
    assert f"importing {broken} raised ModuleNotFoundError" in message
    assert f"{broken}.py:1" in message and "\n" not in message
    with pytest.raises(RewardFunctionError, match=re.escape("package.module:callable")):
        load_reward_function("no colon")


def test_the_key_is_checked_for_its_form_by_the_config():
    with pytest.raises(ValueError, match=re.escape("reward.function is 'module.only'")):
        RewardConfig(function="module.only").validate()
    RewardConfig(function="package.module:callable").validate()


def test_a_worker_that_cannot_import_the_function_scores_errors(tmp_path, monkeypatch):
    """A module the workers cannot import (here: deleted before the pool starts): every item is
    scored ``error`` with the incorrect score, and nothing raises."""
    module = user_module(tmp_path, monkeypatch)
    config = ScoringConfig(function=f"{module}:count")
    (tmp_path / f"{module}.py").unlink()
    results = score_batch(["7", "7 7"], ["7", "7"], config=config, workers=1)
    assert [(r.score, r.reason) for r in results] == [(0.0, "error"), (0.0, "error")]
