"""Where a response states its final answer: the last `Answer: …` line, the last `\\boxed{…}`.

Both verifiers that read an `Answer:` line (`dapo`, `answer`) and the `math_verify` focus use
these helpers, so they agree on which line or box holds the answer.
"""

from __future__ import annotations

import re

ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
"""`Answer`, optional whitespace, `:`, optional whitespace, then the rest of that line (the
whitespace may include line breaks, so `Answer:\\n42` reads `42`)."""

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_answer_line(text: str) -> str | None:
    """The content of the last `Answer: …` line (case-insensitive), or None."""
    matches = ANSWER_LINE.findall(text)
    return matches[-1] if matches else None


def braced_group(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at `text[start] == "{"` and the index after it;
    None when it is never closed."""
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
            group = braced_group(text, after + len(rest) - len(stripped))
            if group is not None:
                return group[0]
        elif rest[:1] == " " and stripped:
            return re.split(r"[\s$]", stripped, maxsplit=1)[0]
    return None
