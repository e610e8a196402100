"""Minerva's `normalize_final_answer` (Lewkowycz et al. 2022), the normalisation of the DAPO rule.
Every step is literal and runs in order; the quirks that follow are part of the rule
(docs/rewards_data_eval.md, "`dapo`: the rule, step by step").
"""

from __future__ import annotations

import re

SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
"""Step (b): (old, new) pairs, applied with `str.replace` in this order."""

REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
"""Step (c): literal strings deleted everywhere, in this order."""

_FIRST_DOLLAR_SPAN = re.compile(r"(.*?)\$(.*?)\$(.*)")
_UNWRAPS = (
    re.compile(r"\\text\{(.*?)\}"),
    re.compile(r"\\textbf\{(.*?)\}"),
    re.compile(r"\\overline\{(.*?)\}"),
    re.compile(r"\\boxed\{(.*)\}"),
)
_FRAC_SHORTHAND = re.compile(r"frac([^{])(.)")
_SQRT_SHORTHAND = re.compile(r"sqrt([^{])")


def normalize_final_answer(answer: str) -> str:
    """`answer` normalised by Minerva's steps (a)–(i), literally and in order."""
    text = answer.split("=")[-1]  # (a) the text after the last `=`
    for old, new in SUBSTITUTIONS:  # (b) articles and all spaces go, `mbox` → `text`, ...
        text = text.replace(old, new)
    for removed in REMOVED_EXPRESSIONS:  # (c) anywhere in the string (`ways` inside `always` too)
        text = text.replace(removed, "")
    text = _FIRST_DOLLAR_SPAN.sub(r"$\2$", text)  # (d) the first `$…$` span, `$` signs kept
    for wrapper in _UNWRAPS:  # (e) each up to the first `}`; `\boxed{…}` up to the last
        text = wrapper.sub(r"\1", text)
    text = _FRAC_SHORTHAND.sub(r"frac{\1}{\2}", text)  # (f) `fracXY` → `frac{X}{Y}`
    text = _SQRT_SHORTHAND.sub(r"sqrt{\1}", text)  # (f) `sqrtX` → `sqrt{X}`
    text = text.replace("$", "")  # (g)
    if text.replace(",", "").isdigit():  # (h) commas deleted when only digits remain
        text = text.replace(",", "")
    return text.strip()  # (i)
