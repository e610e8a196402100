"""Minerva's `normalize_final_answer` (Lewkowycz et al. 2022), the normalisation of the DAPO rule.

Every step is literal, and the steps run in this order; the quirks that follow from them are
part of the rule (see docs/rewards_data_eval.md):

(a) keep the text after the last `=`;
(b) literal substitutions, in order (`SUBSTITUTIONS`): articles and all spaces go, `mbox`
    becomes `text`, `\\text{and}` becomes a comma, `\\text{m}` becomes `\\text{}`;
(c) literal deletions, in order (`REMOVED_EXPRESSIONS`): unit and filler words anywhere in the
    string (`ways` inside `always` too), empty `\\text{}`, degree signs, some spacing macros;
(d) the first `$…$` span replaces the whole string (kept with its `$` signs);
(e) `\\text{…}`, `\\textbf{…}`, `\\overline{…}` are unwrapped (each up to the first `}`), and
    `\\boxed{…}` (up to the last `}`);
(f) `frac` followed by a non-brace character X and one more character Y becomes `frac{X}{Y}`;
    `sqrt` followed by a non-brace character X becomes `sqrt{X}`;
(g) every `$` is deleted;
(h) if deleting the commas leaves only digits, the commas are deleted;
(i) surrounding whitespace is stripped.
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
    """`answer` normalised by steps (a)–(i) of the module docstring."""
    text = answer.split("=")[-1]
    for old, new in SUBSTITUTIONS:
        text = text.replace(old, new)
    for removed in REMOVED_EXPRESSIONS:
        text = text.replace(removed, "")
    text = _FIRST_DOLLAR_SPAN.sub(r"$\2$", text)
    for wrapper in _UNWRAPS:
        text = wrapper.sub(r"\1", text)
    text = _FRAC_SHORTHAND.sub(r"frac{\1}{\2}", text)
    text = _SQRT_SHORTHAND.sub(r"sqrt{\1}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()
