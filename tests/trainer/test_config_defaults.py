"""Each key's default lives once, on its dataclass field: the YAML files that list a section's
defaults agree with the fields, every key they list is commented, every field is documented, and
the other files under conf/ set only keys that exist (docs/training.md, "Configuration")."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from opefo_nemo.config.engines import ENGINE_CONFIGS, MegatronEngineConfig
from opefo_nemo.config.train import TrainConfig
from opefo_nemo.core.objectives import MethodConfig
from tests.config_defaults import (
    commented_keys,
    default_problems,
    is_global,
    undocumented_fields,
    unknown_keys,
)

CONF = Path(__file__).resolve().parents[2] / "conf"
SECTIONS = {
    name: kind for name, kind in typing.get_type_hints(TrainConfig).items() if name != "method"
}
GROUPS = ("model", "data", "engine", "rollout")
"""The sections whose defaults are a group option (conf/config.yaml's defaults list)."""


def section_class(name: str, engine: str = "hf") -> type:
    return ENGINE_CONFIGS[engine] if name == "engine" else SECTIONS[name]


def default_options() -> dict[str, str]:
    """conf/config.yaml's defaults list: group → the option it picks."""
    entries = OmegaConf.load(CONF / "config.yaml")["defaults"]
    return {k: v for entry in entries if not isinstance(entry, str) for k, v in entry.items()}


def default_files() -> list[tuple[str, Path, str | None]]:
    """(section, file, the section's key within the file or None) of every file that holds a
    section's defaults: conf/config.yaml for the sections it sets, the default option of each
    group, and engine/megatron.yaml (the defaults of the megatron-core engines' dataclass)."""
    own = [s for s in SECTIONS if s not in GROUPS]
    files: list[tuple[str, Path, str | None]] = [(s, CONF / "config.yaml", s) for s in own]
    for group, option in default_options().items():
        if group in GROUPS:
            path = CONF / group / f"{option}.yaml"
            files.append((group, path, group if is_global(path) else None))
    return [*files, ("engine", CONF / "engine" / "megatron.yaml", None)]


def test_every_section_has_a_file_of_defaults():
    listed = {section for section, _, _ in default_files()}
    assert listed == set(SECTIONS)
    assert set(default_options()) == {*GROUPS, "method"}


@pytest.mark.parametrize(
    ("section", "path", "key"), default_files(), ids=lambda v: getattr(v, "name", v)
)
def test_the_yaml_defaults_are_the_dataclass_defaults(section, path, key):
    engine = "megatron" if path.name == "megatron.yaml" else "hf"
    assert default_problems(section_class(section, engine)(), path, key) == []


def test_a_differing_missing_or_uncommented_default_is_reported(tmp_path):
    """The check itself can fail: a value changed, a key dropped, a comment dropped, a key added."""
    text = (CONF / "rollout" / "vllm.yaml").read_text()
    broken = text.replace("max_new_tokens: 24", "max_new_tokens: 25")
    broken = re.sub(r"^top_k:.*\n", "", broken, flags=re.MULTILINE)
    broken = re.sub(r"^(num_servers: 1)\s+#.*$", r"\1", broken, flags=re.MULTILINE)
    broken += "extra: 1  # not a field\n"
    (tmp_path / "vllm.yaml").write_text(broken)
    problems = default_problems(SECTIONS["rollout"](), tmp_path / "vllm.yaml")
    assert problems == [
        "vllm.yaml: extra is no field of RolloutConfig",
        "vllm.yaml: top_k is missing (the field's default: 0)",
        "vllm.yaml: max_new_tokens is 25, the field's default 24",
        "vllm.yaml: num_servers has no comment on its line",
    ]


def test_comments_are_found_per_key_and_not_inside_strings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('a:\n  b: "#x"\n  c: 1  # yes\nd: 2\n')
    assert commented_keys(path) == {"a.c"}
    assert commented_keys(path, "a") == {"c"}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_field_is_documented(section):
    classes = [MegatronEngineConfig, *ENGINE_CONFIGS.values()] if section == "engine" else []
    for cls in classes or [SECTIONS[section]]:
        assert undocumented_fields(cls) == []


def variant_files() -> list[Path]:
    """Every other file under conf/ that sets trainer sections (not the methods'): the group
    options that are not the default, and the global files (the presets, the default model's)."""
    defaults = {path for _, path, _ in default_files()}
    options = [path for group in GROUPS for path in sorted((CONF / group).glob("*.yaml"))]
    presets = sorted((CONF / "preset").glob("*.yaml"))
    return [p for p in options if p not in defaults or is_global(p)] + presets


@pytest.mark.parametrize("path", variant_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_other_files_set_only_fields(path):
    """A group option sets keys of its section; a global file sets keys of any section: the
    engine's of the engine it selects, the method's of every method (MethodConfig's)."""
    if not is_global(path):
        group = path.parent.name
        cls = section_class(group, "megatron" if group == "engine" else "hf")
        assert unknown_keys(cls, path) == []
        return
    data = OmegaConf.load(path)
    overrides = {k: v for e in data.get("defaults", []) for k, v in dict(e).items()}
    engine = overrides.get("override /engine", "hf")
    for section in (str(s) for s in data if s != "defaults"):
        cls = MethodConfig if section == "method" else section_class(section, engine)
        assert unknown_keys(cls, path, section) == []
