"""Loading ``conf/method/<name>.yaml`` (merged over ``conf/method/_defaults.yaml``).

The same files serve Hydra's ``method=<name>`` group in the trainer's config; this loader is the
standalone path for tools and tests. Validation is
:func:`~opefo_nemo.core.objectives.method_config`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from opefo_nemo.core.objectives import MethodConfig, method_config

DEFAULTS_FILE = "_defaults.yaml"


def conf_dir() -> Path:
    """The ``conf/`` directory: ``$OPEFO_CONF_DIR`` if set, else the one beside the package."""
    configured = os.environ.get("OPEFO_CONF_DIR")
    path = Path(configured) if configured else Path(__file__).resolve().parents[2] / "conf"
    if not (path / "method" / DEFAULTS_FILE).is_file():
        raise FileNotFoundError(
            f"no opefo-nemo configuration at {path} (expected method/{DEFAULTS_FILE}); "
            "set OPEFO_CONF_DIR to the repository's conf/ directory"
        )
    return path


def method_names() -> list[str]:
    """Names of the method files in ``conf/method`` (``_defaults`` excluded), sorted."""
    return sorted(p.stem for p in (conf_dir() / "method").glob("*.yaml") if p.stem[0] != "_")


def load_method(name_or_path: str | Path, overrides: Sequence[str] = ()) -> MethodConfig:
    """A validated :class:`MethodConfig` from a method name or a YAML path, plus dot-list overrides.

    ``overrides`` are ``key=value`` strings relative to the method (``"lr=1e-6"``,
    ``"entropy_flow.estimator=tabular"``). Errors name the key as ``method.<path>``.
    """
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = conf_dir() / "method" / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown method {name_or_path!r}; available: {method_names()}")
    if not path.is_file():
        raise FileNotFoundError(f"method file {path} does not exist")
    own = OmegaConf.load(path)
    if not isinstance(own, DictConfig):
        raise ValueError(f"method file {path} must hold a mapping")
    own.pop("defaults", None)
    base = OmegaConf.load(conf_dir() / "method" / DEFAULTS_FILE)
    merged = OmegaConf.merge(base, own, OmegaConf.from_dotlist(list(overrides)))
    try:
        data = OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as error:
        raise ValueError(f"missing value for method.{error.full_key} in {path}") from None
    return method_config(cast("dict[str, Any]", data), prefix="method")  # YAML: string keys
