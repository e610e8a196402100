"""Minerva's `normalize_final_answer`, string in -> string out, each expectation derived by hand
from the step named in its comment (opefo_nemo/rewards/minerva.py)."""

from __future__ import annotations

import pytest

from opefo_nemo.rewards.minerva import normalize_final_answer

NORMALISED = [
    ("x = y = 3", "3"),  # (a) " 3"; (b) space
    ("banana", "banana"),  # (b) "an " needs the space: untouched
    ("an apple", "apple"),  # (b) "an " -> ""
    ("a b", "b"),  # (b) "a " -> ""
    ("$7.$", "7"),  # (b) ".$" -> "$"; (d); (g)
    ("\\$5", "5"),  # (b) "\$" -> ""
    ("2\\ 3", "23"),  # (b) "\ " -> ""; (h) all digits already
    ("\\mbox{cm}", ""),  # (b) \text{cm}; (c) cm, then \text{}
    ("1,\\text{and}2", "12"),  # (b) ",\text{and}" -> ","; (h)
    ("5\\text{m}", "5"),  # (b) \text{m} -> \text{}; (c)
    ("always", "al"),  # (c) "ways" deleted inside the word
    ("pursue", "pur"),  # (c) "sue"
    ("3childrentickets", "3"),  # (c) childrentickets
    ("1,2,\\ldots,9", "129"),  # (c) \ldots; (h) "1,2,,9" -> "129"
    ("1,2,\\dots", "12"),  # (c) \dots; (h) "1,2," -> "12"
    ("4\\text{\ns}", "4"),  # (c) \text{<newline>s}
    ("4\\text{\n}", "4"),  # (c) \text{<newline>}
    ("9\\text{}^3", "9"),  # (c) \text{}^3
    ("3^{\\circ}", "3"),  # (c) ^{\circ}
    ('"x"', "x"),  # (c) the double quote
    ("ab$cd$ef$gh$", "cd"),  # (d) first span only; (g)
    ("$$", ""),  # (d) the empty span; (g)
    ("\\text{a}\\text{b}", "ab"),  # (e) each \text{} up to its own first }
    ("\\overline{12}", "12"),  # (e)
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # (e) greedy to the last }
    ("\\boxed{1}+\\boxed{2}", "1}+\\boxed{2"),  # (e) one greedy match: first { to last }
    ("\\frac1{2}", "\\frac{1}{{}2}"),  # (f) X = "1", Y = "{"
    ("\\frac{1}{2}", "\\frac{1}{2}"),  # (f) needs a non-brace after frac
    ("\\sqrt3x", "\\sqrt{3}x"),  # (f)
    ("\\sqrt{3}", "\\sqrt{3}"),  # (f) braced: unchanged
    ("1,000,000", "1000000"),  # (h)
    ("-1,000", "-1,000"),  # (h) "-1000" is not all digits
    ("1,2", "12"),  # (h)
    (",", ","),  # (h) "" is not digits
    ("  7  ", "7"),  # (b) spaces go anyway; (i)
    ("7\n", "7"),  # (i) the newline is stripped
]


@pytest.mark.parametrize(("raw", "expected"), NORMALISED, ids=[repr(r) for r, _ in NORMALISED])
def test_normalize_final_answer(raw: str, expected: str) -> None:
    assert normalize_final_answer(raw) == expected
