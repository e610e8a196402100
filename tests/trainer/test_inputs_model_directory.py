"""A model directory of the user's own that the engines cannot load, made in tmp_path from the tiny
model as a new user breaks one (weights, a weight shard or the tokenizer missing, an architecture
transformers does not build, a GGUF file or a directory of one, no config.json): ``opefo-train``
stops with one line naming what is missing and exit 2, ``opefo-preflight`` reports the same line
as its one problem. The intact model, and its tokenizer moved beside ``config.json``, pass.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from opefo_nemo.cli import preflight as preflight_cli
from opefo_nemo.cli import train as train_cli
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", TinyModelSpec(), seed=0)


def edit_config(model: Path, **changes: object) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **changes}))


def no_weights(model: Path) -> Path:
    (model / "model.safetensors").unlink()
    return model


def missing_shard(model: Path) -> Path:
    """The weights split in two shards by an index, the second not downloaded."""
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    names = ["model.embed_tokens.weight", "lm_head.weight"]
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"metadata": {}, "weight_map": dict(zip(names, shards, strict=True))}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    return model


def no_tokenizer(model: Path) -> Path:
    shutil.rmtree(model / "tokenizer")
    return model


def unknown_architecture(model: Path) -> Path:
    edit_config(model, model_type="mamba_xl", architectures=["MambaXLForCausalLM"])
    return model


def gguf_file(model: Path) -> Path:
    path = model.parent / "tiny-q4_k_m.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def gguf_directory(model: Path) -> Path:
    directory = model.parent / "gguf-only"
    directory.mkdir()
    gguf_file(model).rename(directory / "tiny-q4_k_m.gguf")
    return directory


def no_config(model: Path) -> Path:
    (model / "config.json").unlink()
    return model


CASES: list[tuple[Callable[[Path], Path], str]] = [
    (no_weights, "has no weights (model.safetensors, pytorch_model.bin"),
    (missing_shard, "1 of the 2 weight files model.safetensors.index.json lists are missing "
                    "(model-00002-of-00002.safetensors)"),
    (no_tokenizer, "has no tokenizer (none of tokenizer.json"),
    (unknown_architecture, "model_type 'mamba_xl' (architectures: MambaXLForCausalLM) is not a "
                           "causal language model that transformers"),
    (gguf_file, "is a GGUF file (llama.cpp's format), which the engines do not load"),
    (gguf_directory, "holds tiny-q4_k_m.gguf but no config.json"),
    (no_config, "is not a Hugging Face model directory (no config.json)"),
]  # fmt: skip


def broken_copy(tiny: Path, tmp_path: Path, breaks: Callable[[Path], Path]) -> Path:
    model = tmp_path / "my-model"
    shutil.copytree(tiny, model)
    return breaks(model)


def run_args(model: Path, tmp_path: Path) -> list[str]:
    return ["model=local", f"model.path={model}", f"run.output_dir={tmp_path / 'run'}"]


@pytest.mark.parametrize(("breaks", "says"), CASES, ids=[b.__name__ for b, _ in CASES])
def test_train_and_preflight_refuse_it_in_one_line(tiny, tmp_path, capsys, breaks, says):
    model = broken_copy(tiny, tmp_path, breaks)
    expected = f"model.path={model}"
    assert train_cli.main([*run_args(model, tmp_path), "rollout=engine"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err[-2000:]
    assert lines[0].startswith(f"opefo-train: error: {expected}") and says in lines[0], lines[0]
    assert not (tmp_path / "run").exists()

    assert preflight_cli.main(["--world-size=1", *run_args(model, tmp_path)]) == 1
    report = capsys.readouterr().out.strip().splitlines()
    problems = [line.split("] ", 1)[1] for line in report if line.startswith("[")]
    assert problems == [lines[0].removeprefix("opefo-train: error: ")]  # the same line
    assert report[-1] == "preflight: 1 problem(s)"


def tokenizer_beside_config(model: Path) -> Path:
    for file in (model / "tokenizer").iterdir():
        file.rename(model / file.name)
    (model / "tokenizer").rmdir()
    return model


@pytest.mark.parametrize("layout", [lambda model: model, tokenizer_beside_config])
def test_a_loadable_directory_passes_preflight(tiny, tmp_path, capsys, layout):
    model = broken_copy(tiny, tmp_path, layout)
    assert preflight_cli.main(["--world-size=1", *run_args(model, tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("preflight: OK")
