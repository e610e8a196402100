"""The ``model`` section (``conf/model/tiny_arithmetic_orders.yaml`` holds its defaults): which
policy model, and how the embedded one is warm-started (``model.warm_start``: the dataclass of
``tasks/warm_start.py``). Each field's default is the key's default; its docstring its meaning."""

from __future__ import annotations

from dataclasses import dataclass, field

from opefo_nemo.core.schema import one_of, require
from opefo_nemo.models.packaged import PACKAGED_MODELS
from opefo_nemo.tasks.warm_start import WarmStartConfig


@dataclass(frozen=True)
class ModelConfig:
    """The ``model`` section, with the defaults of the embedded default model,
    ``model=tiny_arithmetic_orders`` (whose file extends this one and adds the run settings that
    suit that model). Another model's file sets the keys it needs; those it leaves out keep these
    defaults."""

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
    shipped_warm_start: bool = True
    """With ``embedded``: copy the warm start shipped with the package (the demo's model, that of
    the documented studies) into a missing ``path`` when its recipe equals this one, instead of
    building it; false: build it (the demo's model: about 4 min on 2 cores)."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """How the embedded model is warm-started (``tasks/warm_start.py``; used only with
    ``embedded``)."""

    def validate(self) -> None:
        """Ranges and contradictions of the ``model`` keys; errors name the key."""
        require(self.path != "", "model.path", "is empty: set model.path=<HF model directory>")
        if self.packaged is not None:
            one_of(self.packaged, tuple(PACKAGED_MODELS), "model.packaged")
            require(
                not self.embedded, "model.packaged", "and model.embedded=true exclude each other"
            )
        self.warm_start.validate()
