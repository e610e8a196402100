"""A verifier's imports are not a response's time: math-verify and sympy take seconds to import
on a loaded machine, so ``score_with_config`` imports them before it arms a response's time
limit. Checked in a fresh interpreter, where nothing has imported them yet."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Records, each time a time limit is armed, whether the math_verify verifier's module (and with
#: it math-verify and sympy) was already imported; then scores one response.
PROBE = """
import sys
from opefo_nemo.rewards import scoring
from opefo_nemo.rewards.result import ScoringConfig
armed_after_import = []
limit = scoring.time_limit
def recording_limit(seconds):
    armed_after_import.append("opefo_nemo.rewards.symbolic" in sys.modules)
    return limit(seconds)
scoring.time_limit = recording_limit
result = scoring.score_with_config("Answer: 3", "3", ScoringConfig(verifier="math_verify"))
print(armed_after_import, result.reason)
"""


def test_math_verify_is_imported_before_the_first_responses_time_limit():
    pytest.importorskip("math_verify")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.split() == ["[True]", "correct"], done.stderr[-2000:]
