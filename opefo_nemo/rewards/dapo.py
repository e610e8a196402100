"""The DAPO reward rule, exactly as DAPO-Math-17k was trained with: the last `Answer:` line in the
response's final 300 characters, normalised by Minerva's rule on both sides, compared as strings;
+1 / −1 (docs/rewards_data_eval.md, "`dapo`: the rule, step by step").
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
    """Whether a normalised answer from `dapo_answer` matches the ground truth under the rule: the
    strings are identical after Minerva's normalisation (an answer normalising to the empty string
    too, so it is wrong unless the ground truth also normalises to empty)."""
    return answer == normalize_final_answer(ground_truth)
