"""``models/directory.py``'s file checks on directories made here: a GGUF file told by its first
bytes, an unreadable file, a weight index without a weight map, a config that is not JSON."""

from __future__ import annotations

from opefo_nemo.models.directory import GGUF_MAGIC, is_gguf, model_files_problem


def test_a_gguf_file_is_told_by_its_magic_and_an_unreadable_path_is_not_one(tmp_path):
    (tmp_path / "weights.bin").write_bytes(GGUF_MAGIC + b"\0" * 8)
    (tmp_path / "other.bin").write_bytes(b"\0" * 12)
    assert is_gguf(tmp_path / "weights.bin")
    assert not is_gguf(tmp_path / "other.bin")
    assert not is_gguf(tmp_path / "missing.bin")


def test_a_broken_index_or_config_is_named(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    assert "config.json is not readable JSON" in model_files_problem(model, "model.path=m")
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    (model / "model.safetensors.index.json").write_text("[]")
    assert "is not a weight index" in model_files_problem(model, "model.path=m")
