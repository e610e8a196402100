"""The generated listing of every configuration key (``opefo_nemo/config/listing.py``): the files
under conf/ that list a section's keys are what the dataclasses generate, they read back as the
dataclasses' defaults, Hydra composes every key by default, and the hand-written files set only
keys that exist (docs/training.md, "Configuration")."""

from __future__ import annotations

import dataclasses
import shutil
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from opefo_nemo.config import load_method
from opefo_nemo.config.field_docs import commented, field_doc, listing, yaml_value
from opefo_nemo.config.listing import (
    COMMAND,
    SECTION_FILES,
    builtin_methods,
    main,
    stale_files,
    unknown_keys,
)
from opefo_nemo.config.train import TrainConfig
from opefo_nemo.core.objectives import objective_class
from opefo_nemo.core.objectives.methods.clip_cov import ClipCovConfig
from opefo_nemo.core.schema import build

CONF = Path(__file__).resolve().parents[2] / "conf"
SECTIONS = {k: v for k, v in typing.get_type_hints(TrainConfig).items() if k != "method"}


def copied(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    return conf


def leaf_keys(values: object, prefix: str = "") -> set[str]:
    if not isinstance(values, dict):
        return {prefix.rstrip(".")}
    return {key for k, v in values.items() for key in leaf_keys(v, f"{prefix}{k}.")}


def field_paths(instance: object, prefix: str = "") -> set[str]:
    paths = set()
    for f in dataclasses.fields(instance):  # type: ignore[arg-type]
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            paths |= field_paths(value, f"{prefix}{f.name}.")
        else:
            paths.add(f"{prefix}{f.name}")
    return paths


def test_the_generated_files_are_current():
    stale = stale_files(CONF)
    assert not stale, "\n".join(stale)


def test_a_stale_or_missing_file_is_named_with_the_command(tmp_path):
    conf = copied(tmp_path)
    vllm = conf / "rollout" / "vllm.yaml"
    vllm.write_text(vllm.read_text().replace("max_new_tokens: 24", "max_new_tokens: 25"))
    (conf / "method" / "grpo.yaml").unlink()
    assert stale_files(conf) == [
        f"conf/rollout/vllm.yaml is stale: regenerate it with `{COMMAND}`",
        f"conf/method/grpo.yaml is stale: regenerate it with `{COMMAND}`",
    ]


def test_the_hand_written_files_set_only_existing_keys():
    assert unknown_keys(CONF) == []


def test_an_unknown_key_is_named_with_its_file(tmp_path):
    """In a group option, a variant of a method, a global file (where a method key must be one
    every method has) and a section that does not exist; a plug-in method's own file is its
    module's business."""
    conf = copied(tmp_path)
    with open(conf / "data" / "word_arithmetic.yaml", "a") as file:
        file.write("max_prompt_tokenz: 3\n")
    with open(conf / "model" / "local.yaml", "a") as file:
        file.write("warm_start:\n  stepz: 1\n")
    with open(conf / "preset" / "tiny_cpu.yaml", "a") as file:
        file.write("method:\n  clip_eps_low: 0.1\nbogus:\n  x: 1\n")
    variant = "defaults: [_defaults, _self_]\nname: opefo\nentropy_flow:\n  target_gainz: 2\n"
    (conf / "method" / "opefo_variant.yaml").write_text(variant)
    (conf / "method" / "plug_in.yaml").write_text("name: not_imported_here\nown_key: 1\n")
    assert unknown_keys(conf) == [
        "conf/data/word_arithmetic.yaml: data.max_prompt_tokenz is no key of DataConfig",
        "conf/method/opefo_variant.yaml: method.entropy_flow.target_gainz is no key of "
        "BalancedConfig",
        "conf/model/local.yaml: model.warm_start.stepz is no key of ModelConfig",
        "conf/preset/tiny_cpu.yaml: method.clip_eps_low is no key of MethodConfig",
        "conf/preset/tiny_cpu.yaml: bogus.x is no key of no section",
    ]


@pytest.mark.parametrize("path", sorted(SECTION_FILES))
def test_a_section_file_reads_back_as_its_dataclass_defaults(path):
    expected = SECTION_FILES[path]()
    data = OmegaConf.to_container(OmegaConf.load(CONF / path), resolve=False)
    assert isinstance(data, dict)
    assert build(type(expected), data, "section") == expected


def test_config_yaml_reads_back_as_the_section_defaults():
    data = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"), resolve=False)
    assert isinstance(data, dict)
    listed = {name for name in data if name != "defaults"}
    assert listed == set(SECTIONS) - {"model", "data", "engine", "rollout"}
    for name in listed:
        assert build(SECTIONS[name], data[name], name) == SECTIONS[name]()


@pytest.mark.parametrize("name", builtin_methods())
def test_a_method_file_gives_its_dataclass_defaults(name):
    assert load_method(name) == objective_class(name).config_type(name=name)


def test_the_default_composition_holds_every_key():
    """Hydra refuses to override a key its composed config lacks: every section's keys are there
    by default, and every key of the default method's settings."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        composed = OmegaConf.to_container(compose(config_name="config"), resolve=False)
    assert isinstance(composed, dict)
    method = objective_class("opefo").config_type(name="opefo")
    defaults = TrainConfig(method=method)
    for name in SECTIONS:
        assert leaf_keys(composed[name]) == field_paths(getattr(defaults, name)), name
    assert leaf_keys(composed["method"]) == field_paths(method) - {"entropy_flow.static_lambda"}


def test_a_setting_of_a_balance_the_method_refuses_is_left_out():
    opefo = OmegaConf.load(CONF / "method" / "opefo.yaml").entropy_flow
    static = OmegaConf.load(CONF / "method" / "static.yaml").entropy_flow
    assert "target_gain" in opefo and "static_lambda" not in opefo
    assert "static_lambda" in static and "target_gain" not in static


@dataclasses.dataclass(frozen=True)
class _PartlyDocumented:
    documented: int = 1
    """Has a meaning."""
    bare: int = 2


def test_a_field_without_a_docstring_stops_the_generation():
    with pytest.raises(ValueError, match=r"_PartlyDocumented\.bare has no docstring under it"):
        listing(_PartlyDocumented())


def test_a_redeclared_field_adds_why_its_default_differs():
    doc = field_doc(ClipCovConfig, "clip_ratio_c")
    assert doc.startswith("Dual clip: for A < 0 the loss is capped at −c·A")
    assert doc.endswith("Off, as in Cui et al.'s Clip-Cov.")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e-6, "1.0e-6"),
        (2.83e-6, "2.83e-6"),
        (1e16, "1.0e+16"),
        (300.0, "300.0"),
        (0.5, "0.5"),
        (7, "7"),
        (True, "true"),
        (None, "null"),
        ((), "[]"),
        ((-2, 1), "[-2, 1]"),
        ("${method.name}", "${method.name}"),
        ("outputs/${run.name}", "outputs/${run.name}"),
        ("???", "???"),
        (",:", '",:"'),
        ("", '""'),
        ("1e-3", '"1e-3"'),
        ("null", '"null"'),
        ("a: b", '"a: b"'),
    ],
)
def test_values_are_written_as_yaml_reads_them(value, text):
    assert yaml_value(value) == text
    read = OmegaConf.to_container(OmegaConf.create(f"key: {text}"), resolve=False)["key"]
    assert read == (list(value) if isinstance(value, tuple) else value)


def test_a_comment_sits_beside_its_key_or_above_a_long_one():
    assert commented("seed: 0", "Which problems go where.", 2) == [
        "seed: 0                      # Which problems go where."
    ]
    long = "path: " + "x" * 60
    assert commented(long, "The model ``directory``.", 0) == ["# The model `directory`.", long]


def test_the_command_writes_the_stale_files_then_checks_clean(tmp_path, capsys):
    conf = copied(tmp_path)
    vllm = conf / "rollout" / "vllm.yaml"
    vllm.write_text(vllm.read_text().replace("top_k: 0", "top_k: 1"))
    assert main(["--check", "--conf", str(conf)]) == 1
    assert "conf/rollout/vllm.yaml is stale" in capsys.readouterr().err
    assert main(["--conf", str(conf)]) == 0
    assert capsys.readouterr().out == "wrote conf/rollout/vllm.yaml\n"
    assert vllm.read_text() == (CONF / "rollout" / "vllm.yaml").read_text()
    assert main(["--check", "--conf", str(conf)]) == 0
