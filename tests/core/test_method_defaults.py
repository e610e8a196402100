"""Each method's defaults live once: every ``conf/method/<name>.yaml`` (merged over
``_defaults.yaml``, as the trainer reads it) builds exactly the settings its dataclass builds from
the name alone, so a default changed in one place and not the other fails here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from omegaconf import OmegaConf

from opefo_nemo.config import load_method
from opefo_nemo.config.method import DEFAULTS_FILE, conf_dir, method_names
from opefo_nemo.core.objectives import MethodConfig, objective_class


def _flat(settings: Any, prefix: str = "") -> dict[str, object]:
    """Every leaf of a settings dataclass by its dotted key."""
    out: dict[str, object] = {}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(value):
            out.update(_flat(value, f"{prefix}{field.name}."))
        else:
            out[f"{prefix}{field.name}"] = value
    return out


@pytest.mark.parametrize("name", method_names())
def test_method_yaml_equals_its_dataclass_defaults(name):
    from_yaml = _flat(load_method(name))
    from_dataclass = _flat(objective_class(name).config_type(name=name))
    differ = {
        key: (from_yaml[key], from_dataclass[key])
        for key in from_yaml
        if from_yaml[key] != from_dataclass[key]
    }
    assert not differ, f"conf/method/{name}.yaml vs its dataclass (yaml, dataclass): {differ}"


def test_common_keys_equal_method_config_defaults():
    common = OmegaConf.to_container(OmegaConf.load(conf_dir() / "method" / DEFAULTS_FILE))
    assert isinstance(common, dict) and common.pop("name") == "???"
    expected = _flat(MethodConfig(name="any"))
    expected.pop("name")
    got = {f"entropy_flow.{k}": v for k, v in common.pop("entropy_flow").items()}
    assert {**common, **got} == expected
