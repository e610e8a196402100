"""The DAPO-Math verification rule: extract, normalise, compare exactly.

Extraction reads the last `Answer: …` line of the response, or in strict mode the last
`\\boxed{…}` near the end of the response. Normalisation turns equivalent spellings of the
same final answer into one string:

- the inside of a `\\boxed{}` is taken, and only the right-hand side of the last `=`;
- math delimiters (`$`, `\\(`, `\\[`), `\\left`/`\\right`, LaTeX spacing (`\\,` `\\;` `\\!` `~`),
  degree signs, percent signs and a trailing full stop are dropped;
- `\\dfrac`/`\\tfrac` become `\\frac`, and the shorthands `\\frac12`, `\\frac1{2}`, `\\sqrt2`
  get their braces (`\\frac{1}{2}`, `\\sqrt{2}`);
- unit words (`cm`, `degrees`, `dollars`, …) at the end are removed and `\\text{…}` wrappers
  are unwrapped;
- all whitespace is removed, and thousands separators in a pure number (`1,000`, `1{,}000`)
  are removed.

Two answers are equal when their normalised strings are identical (so `0.5` and `\\frac{1}{2}`
differ: that is the rule, the `math_verify` verifier handles such equivalences).
"""

from __future__ import annotations

import re

_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOX_COMMANDS = ("\\boxed", "\\fbox")

_UNIT_WORDS = (
    "square units|square feet|square inches|square meters|square centimeters|sq units|units|unit|"
    "centimeters|centimetres|cm|millimeters|mm|kilometers|km|meters|metres|meter|m|"
    "inches|inch|feet|foot|ft|yards|miles|mph|"
    "hours|hour|hrs|minutes|minute|mins|min|seconds|second|sec|days|day|weeks|years|"
    "degrees|degree|radians|dollars|dollar|cents|cent|pounds|grams|gm|kg|liters|ml|"
    "points|ways|students|people|digits|edges|integers|sides"
)
_TRAILING_UNIT = re.compile(r"(?<=[\s}])\s*(?:" + _UNIT_WORDS + r")(?:\s*\^\{?[23]\}?)?\s*$")
_TEXT_WRAPPER = re.compile(
    r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}"
)
_SPACING = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_FRAC_OR_SQRT = re.compile(r"\\(frac|sqrt)(?![A-Za-z])")
_PURE_NUMBER_WITH_COMMAS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def last_answer_line(text: str) -> str | None:
    """The content of the last `Answer: …` line (case-insensitive), or None."""
    matches = _ANSWER_LINE.findall(text)
    return matches[-1] if matches else None


def _braced_group(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at `text[start] == "{"` and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{…}` (or `\\fbox{…}`, or `\\boxed x`), or None.

    Nested braces are matched; an unclosed box is ignored.
    """
    starts = sorted(
        (m.start(), m.end())
        for command in _BOX_COMMANDS
        for m in re.finditer(re.escape(command) + r"(?![A-Za-z])", text)
    )
    for _, after in reversed(starts):
        rest = text[after:]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            group = _braced_group(text, after + len(rest) - len(stripped))
            if group is not None:
                return group[0]
        elif rest[:1] == " " and stripped:
            return re.split(r"[\s$]", stripped, maxsplit=1)[0]
    return None


def _read_argument(text: str, i: int) -> tuple[str, int] | None:
    """One TeX macro argument at `text[i:]`: a brace group or a single character."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] == "{":
        return _braced_group(text, i)
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


def normalize_answer(answer: str) -> str:
    """The canonical string of a final answer under the DAPO rule (see the module docstring)."""
    text = answer.strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    text = text.split("=")[-1]
    text = text.replace("\\$", "").replace("$", "")
    text = re.sub(r"\\[()\[\]]", "", text)
    text = re.sub(r"\\(?:left|right|displaystyle)(?![A-Za-z])", "", text)
    text = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", text)
    text = _DEGREES.sub("", text)
    text = _SPACING.sub(" ", text)
    text = text.replace("\\%", "").replace("%", "")
    text = text.strip().rstrip(".").strip()
    for _ in range(3):
        previous = text
        text = _TRAILING_UNIT.sub("", _TEXT_WRAPPER.sub(r" \1 ", text)).strip()
        if text == previous:
            break
    text = _fix_macro_shorthands(text)
    text = re.sub(r"\s+", "", text).replace("{,}", ",")
    if _PURE_NUMBER_WITH_COMMAS.match(text):
        text = text.replace(",", "")
    return text.rstrip(".")


def extract_dapo_answer(
    response: str, strict_box: bool, tail_chars: int | None, strict_box_chars: int
) -> str | None:
    """The raw (not normalised) answer the DAPO rule reads from a response, or None."""
    text = response if tail_chars is None else response[-tail_chars:]
    if strict_box:
        return last_boxed(text[-strict_box_chars:])
    return last_answer_line(text)
