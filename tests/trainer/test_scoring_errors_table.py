"""docs/training.md's errors table says what a reward that fails on an item scores: this test
reads that row and scores a failing item with every verifier and with ``reward.function``, at
the key's default and at a value of its own, so the table and the code cannot part."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opefo_nemo.config.reward import VERIFIERS, RewardConfig
from opefo_nemo.trainer.scoring import reason_metrics, score_responses

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "training.md"
ROW = "a reward fails on an item"


def errors_table() -> dict[str, str]:
    """The rows of the guide's "Errors" table: situation → behaviour."""
    section = GUIDE.read_text().split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    return {situation.strip(): behaviour.strip() for situation, behaviour in rows}


def stated_defaults(behaviour: str) -> tuple[dict[str, float], float]:
    """The scores the row states for ``reward.incorrect_score: null``: the verifiers it names
    (``N for `name```) and the one it gives "the other verifiers"."""
    plain = behaviour.replace("−", "-")
    named = {
        name: float(value) for value, name in re.findall(r"(-?\d+(?:\.\d+)?) for `(\w+)`", plain)
    }
    others = re.search(
        r"(-?\d+(?:\.\d+)?) for the other verifiers and for `reward\.function`", plain
    )
    assert others is not None, behaviour
    return named, float(others.group(1))


@pytest.fixture
def failing_function(tmp_path, monkeypatch) -> str:
    """``reward.function`` of a module whose function raises on every item."""
    (tmp_path / "errors_table_reward.py").write_text(
        "def score(response, ground_truth):\n    raise ValueError('cannot score this')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "errors_table_reward:score"


def failed_score(settings: RewardConfig) -> float:
    """The score of one item the reward fails on (a response that is not text), which must be
    counted as failed."""
    results = score_responses([None], ["3"], settings)  # type: ignore[list-item]
    assert [r.reason for r in results] == ["error"]
    assert reason_metrics(results)["reward/failed"] == 1.0
    return results[0].score


def test_the_row_names_the_key_and_the_count():
    behaviour = errors_table()[ROW]
    assert "`reward.incorrect_score`" in behaviour and "`reward/failed`" in behaviour


def test_a_failed_item_scores_what_the_row_states(failing_function):
    named, others = stated_defaults(errors_table()[ROW])
    assert set(named) <= set(VERIFIERS)
    for verifier in VERIFIERS:
        assert failed_score(RewardConfig(verifier=verifier)) == named.get(verifier, others)
        assert failed_score(RewardConfig(verifier=verifier, incorrect_score=-0.5)) == -0.5
    assert failed_score(RewardConfig(function=failing_function)) == others
    assert failed_score(RewardConfig(function=failing_function, incorrect_score=-0.5)) == -0.5


def test_the_row_is_read_as_written():
    named, others = stated_defaults(
        "scored `reward.incorrect_score` (null: −1 for `dapo`, 0.5 for `answer`, 0 for the other "
        "verifiers and for `reward.function`)"
    )
    assert (named, others) == ({"dapo": -1.0, "answer": 0.5}, 0.0)
