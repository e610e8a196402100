"""The `answer` verifier: the DAPO rule's extraction with a more lenient normalisation, compared as
exact strings (so `0.5` and `\\frac{1}{2}` differ). Every departure from the DAPO rule, with an
example: docs/rewards_data_eval.md, "`answer` next to `dapo`".
"""

from __future__ import annotations

import re

from opefo_nemo.rewards.extract import braced_group, last_answer_line, last_boxed

_UNIT_WORDS = (
    "square units|square feet|square inches|square meters|square centimeters|sq units|units|unit|"
    "centimeters|centimetres|cm|millimeters|mm|kilometers|km|meters|metres|meter|m|"
    "inches|inch|feet|foot|ft|yards|miles|mph|"
    "hours|hour|hrs|minutes|minute|mins|min|seconds|second|sec|s|days|day|weeks|years|"
    "degrees|degree|radians|dollars|dollar|cents|cent|pounds|grams|gm|kg|liters|ml|"
    "points|ways|students|people|digits|edges|integers|sides|meals|multiples"
)
_TRAILING_UNIT = re.compile(r"(?<=[\s}])\s*(?:" + _UNIT_WORDS + r")(?:\s*\^\{?[23]\}?)?\s*$")
_TEXT_WRAPPER = re.compile(
    r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}"
)
_TEXT_AND = re.compile(r",?\s*\\(?:text|mbox)\s*\{\s*and\s*\}\s*")
_MATH_SPAN = re.compile(r"\$\$(.*?)\$\$|\$(.*?)\$|\\\((.*?)\\\)|\\\[(.*?)\\\]", re.DOTALL)
_LEADING_ARTICLE = re.compile(r"^(?:an?)\s+(?=\S)", re.IGNORECASE)
_DROPPED = ("\\mathrm{th}", "^{\\text{th}}", "\\ldots", "\\dots", '"')
_SPACING = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_FRAC_OR_SQRT = re.compile(r"\\(frac|sqrt)(?![A-Za-z])")
_NUMBER_WITH_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def first_math_span(text: str) -> str:
    """The content of the first `$$…$$`, `$…$`, `\\(…\\)` or `\\[…\\]` span, else `text`.

    An escaped dollar (`\\$`) is a currency sign, not a delimiter.
    """
    unescaped = text.replace("\\$", "")
    match = _MATH_SPAN.search(unescaped)
    if match is None:
        return unescaped
    return next(group for group in match.groups() if group is not None)


def _read_argument(text: str, i: int) -> tuple[str, int] | None:
    """One TeX macro argument at `text[i:]`: a brace group or a single character."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] == "{":
        return braced_group(text, i)
    if text[i] in "}\\":
        return None
    return text[i], i + 1


def _fix_macro_shorthands(text: str) -> str:
    """Give `\\frac` and `\\sqrt` arguments explicit braces: `\\frac12` -> `\\frac{1}{2}`."""
    out: list[str] = []
    i = 0
    while i < len(text):
        match = _FRAC_OR_SQRT.match(text, i)
        if match is None:
            out.append(text[i])
            i += 1
            continue
        name, j = match.group(1), match.end()
        n_args = 2 if name == "frac" else 1
        index = ""
        if name == "sqrt" and text[j : j + 1] == "[":
            close = text.find("]", j)
            if close != -1:
                index, j = text[j : close + 1], close + 1
        args: list[str] = []
        for _ in range(n_args):
            arg = _read_argument(text, j)
            if arg is None:
                break
            args.append(_fix_macro_shorthands(arg[0]))
            j = arg[1]
        if len(args) < n_args:
            out.append(text[i:j])
            i = j
            continue
        out.append(f"\\{name}{index}" + "".join("{" + a + "}" for a in args))
        i = j
    return "".join(out)


def clean_answer_text(answer: str) -> str:
    """The answer without its surroundings: the first math span, no markdown emphasis, no
    leading article, no trailing full stop (whitespace and spelling otherwise kept)."""
    text = first_math_span(answer.strip()).strip()
    text = text.strip("*_ ").strip()
    text = _LEADING_ARTICLE.sub("", text)
    return text.rstrip(".").strip()


def strip_trailing_units(text: str) -> str:
    """`text` without unit words at its end (`42 dollars`, `12\\text{ cm}^2` -> `42`, `12`)."""
    for _ in range(3):
        previous = text
        text = _TRAILING_UNIT.sub("", _TEXT_WRAPPER.sub(r" \1 ", text)).strip()
        text = text.rstrip(".").strip()
        if text == previous:
            break
    return text


def plain_answer(answer: str) -> str:
    """The answer with its spelling simplified but its structure kept (no `=` split, spaces
    kept): `clean_answer_text`, then no `\\left`/`\\right`, ordinal or ellipsis macros, degree
    signs or spacing macros, `\\text{and}` as a comma, no trailing unit words, and braced
    `\\frac`/`\\sqrt` shorthands (`\\frac123` -> `\\frac{1}{2}3`, as TeX reads it)."""
    text = clean_answer_text(answer)
    text = re.sub(r"\\(?:left|right|displaystyle)(?![A-Za-z])", "", text)
    for dropped in _DROPPED:
        text = text.replace(dropped, "")
    text = _DEGREES.sub("", text)
    text = _TEXT_AND.sub(",", text)
    text = _SPACING.sub(" ", text)
    return _fix_macro_shorthands(strip_trailing_units(text.strip().rstrip(".").strip()))


def normalize_answer(answer: str) -> str:
    """The canonical string of a final answer under the `answer` verifier: the inside of a
    `\\boxed{}`, the right-hand side of the last `=`, `plain_answer`, no `$`, `\\dfrac`/`\\tfrac`
    as `\\frac`, no percent signs, no whitespace, no thousands separators (`1,000`,
    `-1{,}000.5`)."""
    text = clean_answer_text(answer)
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    text = plain_answer(text.split("=")[-1]).replace("$", "")
    text = re.sub(r"\\[()\[\]]", "", text)
    text = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", text)
    text = strip_trailing_units(text.replace("\\%", "").replace("%", ""))
    text = _fix_macro_shorthands(text)
    text = re.sub(r"\s+", "", text).replace("{,}", ",")
    if _NUMBER_WITH_THOUSANDS.match(text):
        text = text.replace(",", "")
    return text.rstrip(".")


def extract_answer(
    response: str, strict_box: bool, tail_chars: int | None, strict_box_chars: int
) -> str | None:
    """The raw (not normalised) answer the `answer` verifier reads from a response, or None."""
    text = response if tail_chars is None else response[-tail_chars:]
    if strict_box:
        return last_boxed(text[-strict_box_chars:])
    return last_answer_line(text)
