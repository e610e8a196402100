"""The ``model`` section (``conf/model/tiny_arithmetic_orders.yaml`` holds its defaults): which
policy model, and how the embedded one is warm-started. Each field's default is the key's default;
its docstring its meaning."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.schema import one_of, require
from ..models.packaged import PACKAGED_MODELS
from ..models.tiny import ALPHABET

WARM_START_RATES = ("swap_rate", "carry_first_rate", "zero_carry_rate", "separator_rate")


@dataclass(frozen=True)
class WarmStartConfig:
    """The supervised phase that makes the embedded model (``tasks/warm_start.py``): worked
    solutions of the arithmetic task (``tasks/arithmetic.py``), written with slips and harmless
    choices at these odds. The settings are the recipe stored with the cached model."""

    steps: int = 2000
    """Supervised steps (fewer leave the demo's model erring on the rarer ways of writing)."""
    lr: float = 3e-3
    """AdamW learning rate of the supervised phase, decaying linearly to 0."""
    batch_size: int = 128
    """Worked solutions per supervised step, each drawn afresh."""
    slip_rate: float = 0.4
    """Chance that a column's sum is off by one of ``slips`` (carries and answer follow it)."""
    slips: tuple[int, ...] = (-1,)
    """The offsets a slipped sum may be off by, drawn uniformly (non-zero)."""
    swap_rate: float = 0.15
    """Chance a column's two digits are written in the other order (``8+7=15``)."""
    carry_first_rate: float = 0.15
    """Chance a carry is written first rather than last (``1+4+3=8``)."""
    zero_carry_rate: float = 0.15
    """Chance a column without a carry writes it as ``+0``."""
    separators: str = ",:"
    """Characters that may follow a step instead of the space."""
    separator_rate: float = 0.3
    """Chance a step (not the last) is followed by one of ``separators``."""
    seed: int = 0
    """Seed of the random initialisation and of the supervised phase."""

    def validate(self) -> None:
        """Ranges of the ``model.warm_start`` keys; errors name the key."""
        require(self.steps >= 1, "model.warm_start.steps", "must be >= 1")
        require(self.lr > 0, "model.warm_start.lr", "must be > 0")
        require(self.batch_size >= 1, "model.warm_start.batch_size", "must be >= 1")
        require(0 <= self.slip_rate < 1, "model.warm_start.slip_rate", "must be in [0, 1)")
        require(
            bool(self.slips) and 0 not in self.slips,
            "model.warm_start.slips",
            f"must be a non-empty list of non-zero offsets, got {list(self.slips)}",
        )
        for key in WARM_START_RATES:
            rate = getattr(self, key)
            require(0 <= rate <= 1, f"model.warm_start.{key}", f"must be in [0, 1], got {rate}")
        require(
            not self.separator_rate or bool(self.separators),
            "model.warm_start.separators",
            "is empty, but model.warm_start.separator_rate > 0 needs separators to choose from",
        )
        require(
            set(self.separators) <= set(ALPHABET) - set("0123456789+= \n"),
            "model.warm_start.separators",
            f"({self.separators!r}) must be characters of the tiny model's alphabet other than "
            "digits, '+', '=' and whitespace",
        )


@dataclass(frozen=True)
class ModelConfig:
    path: str = "${oc.env:OPEFO_CACHE,.cache/opefo}/tiny_arithmetic_orders"
    """The model directory (``config.json``, weights, tokenizer); for an embedded model, where
    the warm-started model lives."""
    embedded: bool = True
    """Build and warm-start the tiny model into ``path`` when it does not exist yet; only the
    embedded models' default paths are ever built into: another missing ``model.path`` is an
    error (your own model: ``model=local model.path=...``)."""
    packaged: str | None = None
    """A packaged model converted into ``path`` when it is missing (``models/packaged.py``);
    null: ``path`` must already hold a model, or be built (``embedded``)."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """How the embedded model is warm-started (used only with ``embedded``)."""

    def validate(self) -> None:
        """Ranges and contradictions of the ``model`` keys; errors name the key."""
        require(self.path != "", "model.path", "is empty: set model.path=<HF model directory>")
        if self.packaged is not None:
            one_of(self.packaged, tuple(PACKAGED_MODELS), "model.packaged")
            require(
                not self.embedded, "model.packaged", "and model.embedded=true exclude each other"
            )
        self.warm_start.validate()
