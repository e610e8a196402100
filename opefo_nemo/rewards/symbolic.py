"""The `math_verify` verifier: symbolic equivalence with the math-verify package.

The gold answer is parsed as `\\boxed{gold}` (LaTeX extraction); the response is parsed with
both LaTeX and plain-expression extraction (math-verify picks the last boxed / final answer).
`verify(gold, prediction)` then compares numerically and symbolically (fractions vs decimals,
reordered sums, intervals, sets). math-verify's own `signal.alarm` timeouts are switched off:
the caller owns the time limit (`time_limit.py`, `pool.py`).
"""

from __future__ import annotations

import logging

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

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


def verify_symbolic(response: str, ground_truth: str) -> tuple[bool | None, str | None, bool]:
    """Compare a response with the gold answer.

    Returns (verdict, extracted answer, gold_parsed): verdict is None when no answer was found
    in the response; gold_parsed is False when the gold answer itself could not be parsed.
    """
    gold = parse("\\boxed{" + ground_truth + "}", list(_GOLD_EXTRACTION), parsing_timeout=None)
    prediction = parse(response, list(_PREDICTION_EXTRACTION), parsing_timeout=None)
    answer = _extracted_text(prediction)
    if not prediction:
        return None, None, bool(gold)
    if not gold:
        return False, answer, False
    return bool(verify(gold, prediction, timeout_seconds=None)), answer, True
