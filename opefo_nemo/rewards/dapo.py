"""The DAPO reward rule, exactly as DAPO-Math-17k was trained with.

1. Only the last `DAPO_TAIL_CHARS` (300) characters of the response are read.
2. The answer is the rest of the LAST line there matching `Answer\\s*:\\s*(.+)`
   (case-insensitive); without such a line the response has no answer.
3. The answer and the ground truth both go through Minerva's `normalize_final_answer`
   (`minerva.py`); the response is correct when the two strings are identical.

The rule scores +1 for correct and −1 otherwise (a missing answer included); `RewardConfig`
applies that scale for `verifier="dapo"` unless told otherwise. An answer that normalises to
the empty string is compared like any other (so it is wrong unless the ground truth also
normalises to empty).
"""

from __future__ import annotations

from opefo_nemo.rewards.extract import last_answer_line
from opefo_nemo.rewards.minerva import normalize_final_answer

DAPO_TAIL_CHARS = 300


def dapo_answer(response: str, tail_chars: int | None = DAPO_TAIL_CHARS) -> str | None:
    """The normalised answer the rule reads from `response`, or None when it has none.

    tail_chars: how much of the end of the response is read; None reads all of it (not the
    rule).
    """
    text = response if tail_chars is None else response[-tail_chars:]
    line = last_answer_line(text)
    return None if line is None else normalize_final_answer(line)


def dapo_correct(answer: str, ground_truth: str) -> bool:
    """Whether a normalised answer from `dapo_answer` matches the ground truth under the rule."""
    return answer == normalize_final_answer(ground_truth)
