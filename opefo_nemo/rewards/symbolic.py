"""The `math_verify` verifier: symbolic equivalence with the math-verify package, on the
response's focused final answer (docs/rewards_data_eval.md, "`math_verify`'s focus").
math-verify's own `signal.alarm` timeouts are off: the caller owns the time limit.
"""

from __future__ import annotations

import logging
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from opefo_nemo.rewards.answer import plain_answer
from opefo_nemo.rewards.extract import last_answer_line, last_boxed

# math-verify warns once per process that its own timeout is off; ours replaces it.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_GOLD_EXTRACTION = (LatexExtractionConfig(),)
_PREDICTION_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())
_DIGIT_GROUP_SEPARATOR = re.compile(r"(?<=\d)(?:\s|\\[,;: ]|~|\{,\}|,\\!)(?=\d{3}(?!\d))")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{3,}")


def _extracted_text(parsed: list) -> str | None:
    """The answer text math-verify extracted (its string entry), else the parsed expression."""
    for item in parsed:
        if isinstance(item, str):
            return item
    return str(parsed[0]) if parsed else None


def _has_expression(parsed: list) -> bool:
    """Whether math-verify turned the text into an expression (not only echoed a string)."""
    return any(not isinstance(item, str) for item in parsed)


def _is_prose(text: str) -> bool:
    """Whether `text` holds a word (three or more letters outside LaTeX commands)."""
    return _WORD.search(_LATEX_COMMAND.sub("", text)) is not None


def focus_candidates(response: str) -> list[str]:
    """The texts tried, in order, as the response's final answer: the last `Answer:` line cleaned
    (`1 000`, `1\\;000`, `1{,}000` → `1000`, then `plain_answer`), the same line as written (both
    wrapped in `$…$` so bare LaTeX parses), the last `\\boxed{}`, the whole response. Focusing
    makes the last answer win and keeps math-verify from reading a bare number out of unparsed
    LaTeX (`3\\,\\sqrt{2}` read as 3); the fallbacks score an answer line math-verify cannot
    read (`forty-two`) by what the rest of the response says."""
    candidates = []
    line = last_answer_line(response)
    if line is not None:
        cleaned = plain_answer(_DIGIT_GROUP_SEPARATOR.sub("", line))
        raw = line.strip().strip("$").strip()
        candidates += ["$" + text + "$" for text in dict.fromkeys((cleaned, raw)) if text]
    boxed = last_boxed(response)
    if boxed is not None:
        candidates.append("\\boxed{" + boxed + "}")
    candidates.append(response)
    return candidates


def parse_prediction(response: str) -> list:
    """math-verify's parse of the first focus candidate that parses to an expression and is not
    prose (math-verify reads `forty-two` as a product of symbols); else of the whole response
    (possibly empty)."""
    *focused, whole = focus_candidates(response)
    for text in focused:
        parsed = parse(text, list(_PREDICTION_EXTRACTION), parsing_timeout=None)  # type: ignore[arg-type]  # None: no signal-based timeout
        if _has_expression(parsed) and not _is_prose(text):
            return parsed
    return parse(whole, list(_PREDICTION_EXTRACTION), parsing_timeout=None)  # type: ignore[arg-type]  # None: no signal-based timeout


def verify_symbolic(response: str, ground_truth: str) -> tuple[bool | None, str | None, bool]:
    """Compare a response with the gold answer (parsed as `\\boxed{gold}`), numerically and
    symbolically (fractions vs decimals, reordered sums, intervals, sets).

    Returns (verdict, extracted answer, gold_parsed): verdict is None when no answer was found
    in the response; gold_parsed is False when the gold answer itself could not be parsed.
    """
    gold = parse("\\boxed{" + ground_truth + "}", list(_GOLD_EXTRACTION), parsing_timeout=None)  # type: ignore[arg-type]  # None: no signal-based timeout
    prediction = parse_prediction(response)
    answer = _extracted_text(prediction)
    if not prediction:
        return None, None, bool(gold)
    if not gold:
        return False, answer, False
    return bool(verify(gold, prediction, timeout_seconds=None)), answer, True
