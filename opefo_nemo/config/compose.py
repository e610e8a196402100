"""Composing ``conf/config.yaml`` with command-line overrides (Hydra's compose API, NeMo style).

``compose(["method=grpo_strict", "trainer.max_steps=50", "++rollout.temperature=0.8"])`` returns
the validated :class:`TrainConfig` and the resolved plain dict (saved with checkpoints). Hydra is
used only to compose: it neither changes the working directory nor writes its own outputs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, cast

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from opefo_nemo.config.method import conf_dir
from opefo_nemo.config.train import TrainConfig


def compose(overrides: Sequence[str] = ()) -> tuple[TrainConfig, dict[str, Any]]:
    """The run's config from ``conf/config.yaml`` plus ``overrides``; errors name the key."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            composed = hydra_compose(config_name="config", overrides=list(overrides))
    except HydraException as error:
        raise ValueError(
            f"configuration overrides {list(overrides)}: {hydra_error_message(error)}"
        ) from None
    try:
        data = OmegaConf.to_container(composed, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as error:
        raise ValueError(
            f"missing value for {error.full_key}: set it on the command line"
        ) from None
    assert isinstance(data, dict)
    mapping = cast("dict[str, Any]", data)  # YAML keys are strings
    return TrainConfig.from_mapping(mapping), mapping


def hydra_error_message(error: Exception) -> str:
    """Hydra's error on one line: an unknown key named as such; otherwise without the config search
    path, and with a group's available options after the message, less ``_defaults`` (the base
    the method files extend, not a method)."""
    text = str(error).split("Config search path:")[0]
    unknown = re.match(r"Could not override '([^']+)'", text)
    if unknown:  # Hydra's hint, "use +key=value", would only move the error to validation
        return f"unknown key {unknown.group(1)} (no such key in conf/)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0].startswith("In '"):  # "In 'config': Could not find ..."
        lines[0] = lines[0].split(": ", 1)[-1]
    listed = [i for i, line in enumerate(lines) if line.startswith("Available options")]
    if not listed:
        return " ".join(lines)
    options = [line for line in lines[listed[0] + 1 :] if not line.startswith("_")]
    return f"{' '.join(lines[: listed[0]])} (available: {', '.join(options)})"
