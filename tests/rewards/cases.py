r"""The reward case table: each row is judged by all three verifiers.

Row: (id, response, ground truth, dapo, answer, math_verify). The dapo outcome is derived by
hand from the DAPO rule (last 300 characters, last `Answer:` line, Minerva normalisation steps
(a)–(i) of opefo_nemo/rewards/minerva.py, exact comparison); the comment names the deciding
step. The answer outcome follows the documented lenient normalisation, the math_verify outcome
mathematical equivalence (None: not judged, e.g. ambiguous notation). QUIRKS are the rows where
the rule accepts and `answer` deliberately does not (docs/rewards_data_eval.md).
"""

from __future__ import annotations

C, W, N = "correct", "wrong", "no_answer"
LONG_TAIL = "\n" + "Let me double-check the arithmetic once more. " * 10  # 471 characters

CASES = [
    # --- extraction: which line, which window
    ("frac", "So we get it.\nAnswer: \\frac{1}{2}", "\\frac{1}{2}", C, C, C),  # unchanged
    ("answer-line-last-wins", "Answer: 3\nOops, recheck.\nAnswer: 4", "4", C, C, C),  # last line
    ("answer-line-not-first", "Answer: 3\nOops, recheck.\nAnswer: 4", "3", W, W, W),
    ("answer-case", "ANSWER: 7", "7", C, C, C),  # pattern is case-insensitive
    ("answer-lowercase", "so the answer: 7", "7", C, C, C),  # `answer:` inside a sentence
    ("answer-space-before-colon", "Answer :  42", "42", C, C, C),  # \s*:\s*
    ("answer-next-line", "Answer:\n42", "42", C, C, C),  # \s* crosses the line break
    ("answer-no-colon", "The answer is 42", "42", N, N, C),  # no `Answer:` -> invalid
    ("answer-colon-only", "Answer:", "3", N, N, N),  # (.+) needs a character -> invalid
    ("answer-blank", "Answer: ", "3", W, N, N),  # captures " "; (b) -> "" != "3"
    ("missing", "I could not finish the problem.", "3", N, N, N),
    ("answer-beyond-tail", "Answer: 42" + LONG_TAIL, "42", N, N, C),  # line outside the 300
    ("tail-exactly-300", "Answer: 7\n" + "." * 290, "7", C, C, C),  # 300 chars: whole line in
    ("tail-301-cuts-line", "Answer: 7\n" + "." * 291, "7", N, N, C),  # window starts at "nswer"
    ("tail-later-line", "Answer: 3\n" + LONG_TAIL + "\nAnswer: 4", "4", C, C, C),
    ("nested-braces", "Thus $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt{3}}{2}", N, N, C),
    ("nested-rationalised", "$\\boxed{\\frac{1}{\\sqrt{2}}}$", "\\frac{\\sqrt{2}}{2}", N, N, C),
    ("several-boxed-last", "First \\boxed{3}, no wait: \\boxed{4}", "4", N, N, C),
    ("several-boxed-not-first", "First \\boxed{3}, no wait: \\boxed{4}", "3", N, N, W),
    ("interval-infinity", "$\\boxed{(-\\infty, 3)}$", "(-\\infty,3)", N, N, C),
    ("pi-boxed", "$\\boxed{2\\pi}$", "2\\pi", N, N, C),
    ("polynomial-boxed", "$\\boxed{x^2 + 2x + 1}$", "(x+1)^2", N, N, C),
    ("set-order-boxed", "$\\boxed{\\{3, 1, 2\\}}$", "\\{1,2,3\\}", N, N, C),
    # --- (a) the text after the last `=`
    ("equation-rhs", "Answer: x = 7", "7", C, C, C),  # (a) " 7"; (b) "7"
    ("equation-chain", "Answer: a = b = 5", "5", C, C, None),  # (a) " 5"
    ("equation-in-truth", "Answer: 5", "x = 5", C, C, C),  # (a) on the truth too
    ("or-takes-last", "Answer: x = 2 or x = 42", "42", C, C, W),  # (a) " 42"
    ("or-set", "Answer: x = 2 or x = 42", "2, 42", W, W, C),  # "42" vs (h) "242"
    # --- (b) substitutions
    ("article-an", "Answer: an 8", "8", C, C, C),  # (b) "an " -> ""
    ("article-inside-quirk", "Answer: 2a + 3", "2 + 3", C, W, W),  # (b) "a " -> "": "2+3"
    ("article-in-truth-quirk", "Answer: 2a+1", "2a + 1", W, C, C),  # truth (b) -> "2+1"
    ("dollar-period", "Answer: $42.$", "42", C, C, C),  # (b) ".$" -> "$"; (d); (g)
    ("escaped-dollar", "Answer: \\$42", "42", C, C, C),  # (b) "\$" -> ""
    ("escaped-space", "Answer: 4\\ \\text{inches}", "4", C, C, C),  # (b); (c) inches, \text{}
    ("negative-spaced", "Answer: - 5", "-5", C, C, C),  # (b) spaces go
    ("interval", "Answer: (1, 2]", "(1,2]", C, C, C),  # (b) spaces go
    ("mbox", "Answer: 5\\mbox{ cm}", "5", C, C, C),  # (b) mbox->text; (c) cm, \text{}
    ("text-and", "Answer: 1, 2, \\text{and} 3", "1,2,3", C, C, C),  # (b) ",\text{and}"; (h)
    ("text-and-no-comma", "Answer: 2 \\text{and} 5", "2,5", C, C, C),  # (b) -> "2,5"; (h) both
    ("text-m", "Answer: 7 \\text{m}", "7", C, C, C),  # (b) \text{m} -> \text{}; (c)
    # --- (c) deletions
    ("units-cm", "Answer: 12 cm", "12", C, C, C),  # (c) cm
    ("units-text-dollars", "Answer: 30\\text{ dollars}", "30", C, C, C),  # (c) dollars, \text{}
    ("units-dollars", "Answer: 42 dollars", "42", C, C, C),  # (c) dollars
    ("square-units", "Answer: 16 square units", "16", C, C, C),  # (c) square, units
    ("square-feet", "Answer: 42 \\text{ square feet}", "42", C, C, C),  # (c) square, feet
    ("ways", "Answer: 6 ways", "6", C, C, C),  # (c) ways
    ("mph", "Answer: 45 mph", "45", C, C, C),  # (c) mph
    ("hours", "Answer: 3 hours", "3", C, C, C),  # (c) hours
    ("km", "Answer: 20 km", "20", C, C, C),  # (c) km
    ("feet", "Answer: 8 feet", "8", C, C, C),  # (c) feet
    ("ft-not-in-rule", "Answer: 8 ft", "8", W, C, C),  # "ft" is not deleted: "8ft"
    ("minutes", "Answer: 90 minutes", "90", C, C, C),  # (c) minutes
    ("digits", "Answer: 4 digits", "4", C, C, C),  # (c) digits
    ("cents", "Answer: 75 cents", "75", C, C, C),  # (c) cents
    ("pounds", "Answer: 12 pounds", "12", C, C, C),  # (c) pounds
    ("meters", "Answer: 100 meters", "100", C, C, C),  # (c) meters
    ("edges", "Answer: 12 edges", "12", C, C, C),  # (c) edges
    ("students", "Answer: 30 students", "30", C, C, C),  # (c) students
    ("points", "Answer: 5 points", "5", C, C, C),  # (c) points
    ("integers", "Answer: 3 integers", "3", C, C, C),  # (c) integers
    ("gm", "Answer: 50 gm", "50", C, C, C),  # (c) gm
    ("meals", "Answer: 9 meals", "9", C, C, C),  # (c) meals
    ("multiples", "Answer: 14 multiples", "14", C, C, C),  # (c) multiples
    ("units-case", "Answer: 5 CM", "5", W, W, W),  # deletions are case-sensitive: "5CM"
    ("hours-minutes-quirk", "Answer: 4 hours 30 minutes", "430", C, W, W),  # (c) -> "430"
    ("units-degrees-circ", "Answer: 90^\\circ", "90", C, C, C),  # (c) ^\circ
    ("units-degrees-braced", "Answer: 30^{\\circ}", "30", C, C, C),  # (c) ^{\circ}
    ("units-degrees-word", "Answer: 45 \\text{degrees}", "45", C, C, C),  # (c) degrees, \text{}
    ("units-in-truth", "Answer: 12", "12 \\text{ cm}", C, C, C),  # truth (c) cm, \text{}
    ("text-s", "Answer: 5\\text{s}", "5", C, C, C),  # (c) \text{s}
    ("text-dot", "Answer: 12\\text{.}", "12", C, C, C),  # (c) \text{.}
    ("text-squared", "Answer: 25\\text{ cm}^2", "25", C, C, C),  # (c) cm, then \text{}^2
    ("mathrm-th", "Answer: 5\\mathrm{th}", "5", C, C, C),  # (c) \mathrm{th}
    ("semicolon-space", "Answer: 1\\;000", "1000", C, C, C),  # (c) \;
    ("comma-bang", "Answer: 1,\\!000", "1000", C, C, C),  # (c) ,\!
    ("thousands-latex", "Answer: 1{,}000{,}000", "1000000", C, C, C),  # (c) {,}
    ("double-quotes", 'Answer: "42"', "42", C, C, C),  # (c) the double quote
    # --- (d) the first $…$ span
    ("bold-label-dollars", "**Answer:** $42$", "42", C, C, C),  # (d) "**$42$" -> "$42$"
    ("prose-dollars", "Answer: The answer is $42$.", "42", C, C, C),  # (d) drops the prose
    ("dollars-then-prose", "Answer: $42$ (after simplifying)", "42", C, C, C),  # (d)
    ("two-spans-first", "Answer: $42$ or $43$", "43", W, W, W),  # (d) keeps "$42$"
    ("double-dollars", "Answer: $$42$$", "42", W, C, C),  # (d) "$$"; (g) "" != "42"
    ("empty-dollars", "Answer: $$", "3", W, N, N),  # (d) "$$"; (g) ""
    ("negative-dollars", "Answer: $-3$", "-3", C, C, C),  # (d); (g)
    ("frac-shorthand", "Answer: $\\frac12$", "\\frac{1}{2}", C, C, C),  # (d); (f); (g)
    # --- (e) unwrapping
    ("answer-line-boxed", "Answer: $\\boxed{42}$", "42", C, C, C),  # (e) \boxed; (g)
    ("boxed-after-prose-dollars", "Answer: so $\\boxed{42}$", "42", C, C, C),  # (d); (e)
    ("boxed-after-prose", "Answer: the answer is \\boxed{42}", "42", W, C, C),  # (e) keeps prose
    ("boxed-in-truth", "Answer: 5", "\\boxed{5}", C, C, C),  # truth (e)
    ("textbf", "Answer: \\textbf{42}", "42", C, C, C),  # (e) \textbf
    ("text-choice", "Answer: \\text{(B)}", "(B)", C, C, None),  # (e) \text
    ("overline-quirk", "Answer: 0.\\overline{3}", "0.3", C, W, W),  # (e) "0.3": 1/3 == 0.3
    ("mathbf", "Answer: \\mathbf{42}", "42", W, C, C),  # \mathbf is not unwrapped
    # --- (f) shorthands
    ("frac-letters-quirk", "Answer: \\fracab", "\\frac{a}{b}", C, W, C),  # (f) frac{a}{b}
    ("frac-three-chars", "Answer: \\frac123", "\\frac{1}{2}3", C, C, C),  # (f) "frac{1}{2}3"
    ("frac-half-shorthand", "Answer: \\frac1{2}", "\\frac{1}{2}", W, C, C),  # (f) frac{1}{{}2}
    ("sqrt-shorthand", "Answer: \\sqrt2", "\\sqrt{2}", C, C, C),  # (f) sqrt{2}
    ("sqrt-then-digit", "Answer: \\sqrt23", "\\sqrt{2}3", C, C, C),  # (f) sqrt{2}3
    ("dfrac", "Answer: \\dfrac{1}{2}", "\\frac{1}{2}", W, C, C),  # "\dfrac{1}{2}" stays
    ("dfrac-shorthand", "Answer: \\dfrac12", "\\frac{1}{2}", W, C, C),  # (f) \dfrac{1}{2}
    ("dfrac-both", "Answer: \\dfrac{1}{2}", "\\dfrac{1}{2}", C, C, C),  # identical
    ("tfrac-vs-decimal", "Answer: \\tfrac{3}{4}", "0.75", W, W, C),
    # --- (h) commas of an all-digit string
    ("thousands", "Answer: 1,000", "1000", C, C, C),  # (h)
    ("comma-digits-quirk", "Answer: 3, 4", "34", C, W, W),  # (b) "3,4"; (h) "34"
    ("comma-truth-quirk", "Answer: 34", "3, 4", C, W, W),  # truth (h) "34"
    ("comma-misplaced-quirk", "Answer: 1,00", "100", C, W, W),  # (h) "100"
    ("signed-thousands", "Answer: -1,000", "-1000", W, C, C),  # (h) "-1000" is not all digits
    ("decimal-thousands", "Answer: 1,234.5", "1234.5", W, C, C),  # (h) "." is not a digit
    ("spaced-thousands", "Answer: 1 000", "1000", C, C, C),  # (b) spaces go
    # --- what the rule leaves alone
    ("percent", "Answer: 25\\%", "25", W, C, C),  # "\%" stays
    ("percent-plain", "Answer: 25%", "25", W, C, None),  # "%" stays
    ("percent-both", "Answer: 100\\%", "100\\%", C, C, C),  # identical
    ("trailing-period", "Answer: 5.", "5", W, C, C),  # "." not before "$" stays
    ("frac-period", "Answer: \\frac{1}{2}.", "\\frac{1}{2}", W, C, C),  # "." stays
    ("bold-number", "Answer: **42**", "42", W, C, C),  # "*" stays
    ("paren-delimiters", "Answer: \\(42\\)", "42", W, C, C),  # "\(" stays
    ("bracket-delimiters", "Answer: \\[42\\]", "42", W, C, C),  # "\[" stays
    ("latex-thin-space", "Answer: 3\\,\\sqrt{2}", "3\\sqrt{2}", W, C, C),  # "\," stays
    ("latex-left-right", "Answer: \\left( 1, 2 \\right)", "(1,2)", W, C, C),  # \left stays
    # --- comparison is of strings
    ("dfrac-vs-decimal", "Answer: 0.5", "\\frac{1}{2}", W, W, C),
    ("decimal-equal", "Answer: 0.5", "0.5", C, C, C),
    ("decimal-trailing-zero", "Answer: 0.50", "0.5", W, W, C),
    ("slash-fraction", "Answer: 1/2", "\\frac{1}{2}", W, W, C),
    ("slash-both", "Answer: 1/2", "1/2", C, C, C),
    ("wrong-frac", "Answer: \\frac{1}{3}", "\\frac{1}{2}", W, W, W),
    ("neg-frac-spelling", "Answer: \\frac{-1}{2}", "-\\frac{1}{2}", W, W, C),
    ("negative", "Answer: -5", "-5", C, C, C),
    ("negative-sign-missing", "Answer: 5", "-5", W, W, W),
    ("interval-wrong-bracket", "Answer: [1, 2]", "(1,2]", W, W, W),
    ("half-open", "Answer: [2, 5)", "[2,5)", C, C, C),  # (b) spaces go
    ("set-braces", "Answer: \\{1, 2\\}", "\\{1,2\\}", C, C, C),  # (b) spaces go
    ("equivalent-radicals", "Answer: 2\\sqrt{3}", "\\sqrt{12}", W, W, C),
    ("polynomial-spaces", "Answer: x^2 + 2x + 1", "x^2+2x+1", C, C, C),  # (b) spaces go
    ("polynomial-factored", "Answer: (x+1)^2", "x^2+2x+1", W, W, C),
    ("pi", "Answer: 2\\pi", "2\\pi", C, C, C),
    ("pi-decimal", "Answer: 6.28", "2\\pi", W, W, W),
    ("infinity", "Answer: \\infty", "\\infty", C, C, C),
    ("units-word", "Answer: 7 units", "7", C, C, C),  # (c) units
]

QUIRKS = {
    "article-inside-quirk": "(b) deletes `a ` anywhere, so `2a + 3` reads `2+3`",
    "hours-minutes-quirk": "(c) deletes unit words anywhere, so `4 hours 30 minutes` reads `430`",
    "overline-quirk": "(e) unwraps `\\overline`, so the repeating decimal 0.333… reads `0.3`",
    "comma-digits-quirk": "(h) drops commas between digits, so the list `3, 4` reads `34`",
    "comma-truth-quirk": "(h) on the ground truth: a list `3, 4` reads `34`",
    "frac-letters-quirk": "(f) reads `\\fracab` as `\\frac{a}{b}` (to TeX an unknown macro)",
    "comma-misplaced-quirk": "(h) drops any comma between digits, so `1,00` reads `100`",
}
