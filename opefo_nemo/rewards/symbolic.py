"""The `math_verify` verifier: symbolic equivalence with the math-verify package.

The gold answer is parsed as `\\boxed{gold}` (LaTeX extraction). The response is first focused
on its final answer: the content of its last `Answer:` line (wrapped in `$…$` so bare LaTeX
parses), else its last `\\boxed{}`, else the whole response; that text is parsed with both LaTeX
and plain-expression extraction. Focusing makes the last answer win and keeps math-verify from
reading a bare number out of unparsed LaTeX (`3\\,\\sqrt{2}` read as 3).
`verify(gold, prediction)` then compares numerically and symbolically (fractions vs decimals,
reordered sums, intervals, sets). math-verify's own `signal.alarm` timeouts are switched off:
the caller owns the time limit (`time_limit.py`, `pool.py`).
"""

from __future__ import annotations

import logging

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from opefo_nemo.rewards.dapo import last_answer_line, last_boxed

# math-verify warns once per process that its own timeout is off; ours replaces it.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_GOLD_EXTRACTION = (LatexExtractionConfig(),)
_PREDICTION_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())


def _extracted_text(parsed: list) -> str | None:
    """The answer text math-verify extracted (its string entry), else the parsed expression."""
    for item in parsed:
        if isinstance(item, str):
            return item
    return str(parsed[0]) if parsed else None


def focus_final_answer(response: str) -> str:
    """The part of `response` that holds its final answer (see the module docstring)."""
    line = last_answer_line(response)
    if line is not None and line.strip().strip("$").strip():
        return "$" + line.strip().strip("$").strip() + "$"
    boxed = last_boxed(response)
    if boxed is not None:
        return "\\boxed{" + boxed + "}"
    return response


def verify_symbolic(response: str, ground_truth: str) -> tuple[bool | None, str | None, bool]:
    """Compare a response with the gold answer.

    Returns (verdict, extracted answer, gold_parsed): verdict is None when no answer was found
    in the response; gold_parsed is False when the gold answer itself could not be parsed.
    """
    gold = parse("\\boxed{" + ground_truth + "}", list(_GOLD_EXTRACTION), parsing_timeout=None)
    focused = focus_final_answer(response)
    prediction = parse(focused, list(_PREDICTION_EXTRACTION), parsing_timeout=None)
    answer = _extracted_text(prediction)
    if not prediction:
        return None, None, bool(gold)
    if not gold:
        return False, answer, False
    return bool(verify(gold, prediction, timeout_seconds=None)), answer, True
