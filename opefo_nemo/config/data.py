"""The ``data`` section (``conf/data/arithmetic.yaml`` holds its defaults): the training and
validation problems. Each field's default is the key's default; its docstring its meaning."""

from __future__ import annotations

from dataclasses import dataclass, field

from opefo_nemo.core.schema import one_of, require

GENERATED_DATA = ("arithmetic", "word_arithmetic")
"""``data.train`` / ``data.validation`` values that name a built-in task instead of a file."""
LONG_PROMPT_POLICIES = ("skip", "error")
OPERATIONS = ("add", "multiply")
"""``data.arithmetic.operation`` values; the embedded task (``arithmetic``) adds only."""
WORD_TASK_KEYS = ("operation", "max_operand")
"""``data.arithmetic`` keys only ``word_arithmetic`` reads; the embedded task needs their
defaults."""


@dataclass(frozen=True)
class ArithmeticConfig:
    """The built-in tasks' problems (``tasks/arithmetic.py``, ``tasks/word_arithmetic.py``)."""

    digits: int = 2
    """Digits of each operand (1..4): a worked solution has one step per digit."""
    num_train: int = 2000
    """Training problems (capped by the number of distinct ones)."""
    num_validation: int = 64
    """Held-out validation problems."""
    seed: int = 1234
    """Which problems go where."""
    operation: str = "add"
    """``add`` ("What is 3 + 5?") | ``multiply`` ("What is 3 * 5?", ``word_arithmetic`` only:
    the embedded task's worked solutions are column additions)."""
    max_operand: int | None = None
    """null: operands of ``digits`` digits; a number n: operands 0..n instead, ``digits`` unused
    (``word_arithmetic`` only; 12 with ``multiply``: the times tables to 12, 169 questions)."""

    def validate(self) -> None:
        require(1 <= self.digits <= 4, "data.arithmetic.digits", "must be in 1..4")
        require(self.num_train >= 1, "data.arithmetic.num_train", "must be >= 1")
        one_of(self.operation, OPERATIONS, "data.arithmetic.operation")
        require(
            self.max_operand is None or self.max_operand >= 1,
            "data.arithmetic.max_operand",
            f"({self.max_operand}) must be >= 1, or null",
        )


@dataclass(frozen=True)
class DataConfig:
    """The ``data`` section, with the defaults of ``data=arithmetic``: the embedded synthetic task
    (``tasks/arithmetic.py``), addition of two multi-digit numbers written out column by column,
    "47+38=" → "7+8=15 4+3+1=8 =85"; the verifier ``arithmetic`` scores the final answer (after
    the lone "=")."""

    train: str = "arithmetic"
    """A built-in task (``arithmetic``, ``word_arithmetic``: generated) or a .jsonl / .parquet
    file of problems."""
    validation: str | None = "arithmetic"
    """A built-in task (its held-out problems), a file, or null."""
    template: str = "raw"
    """Prompt template (``data/templates.py``): raw | dapo | boxed | messages."""
    max_prompt_tokens: int = 32
    """Longer prompts are skipped (counted) or an error, see ``long_prompt``."""
    long_prompt: str = "skip"
    """skip | error."""
    defective_rows: str = "error"
    """A file row with an empty or missing problem or answer: ``error`` refuses the file naming
    every such row, ``skip`` reads the others and warns with the count and the rows
    (``data/loaders.py``)."""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    """The built-in tasks' problems."""

    def validate(self) -> None:
        if "arithmetic" in (self.train, self.validation):  # the embedded task
            defaults = ArithmeticConfig()
            for key in WORD_TASK_KEYS:
                value = getattr(self.arithmetic, key)
                require(
                    value == getattr(defaults, key),
                    f"data.arithmetic.{key}",
                    f"is {value!r}, but the embedded task (data.train or data.validation = "
                    "arithmetic) writes column additions of `digits`-digit operands; "
                    "use word_arithmetic",
                )
        one_of(self.long_prompt, LONG_PROMPT_POLICIES, "data.long_prompt")
        one_of(self.defective_rows, ("error", "skip"), "data.defective_rows")
        require(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", "must be >= 1")
        self.arithmetic.validate()
