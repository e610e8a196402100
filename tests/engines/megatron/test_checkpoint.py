"""``save_megatron`` / ``load_megatron`` (what ``MegatronPolicy.save`` / ``load`` run) on real
megatron-core GPTModels in megatron's ``DistributedDataParallel`` with megatron's optimizer, over
2 gloo ranks (the world in ``workers_ckpt`` runs once; each test asserts one of its records)."""

from __future__ import annotations

import json

import pytest
import torch

from opefo_nemo.engines.megatron.checkpoint import (
    MANIFEST,
    MEGATRON_OPTIMIZER,
    load_megatron,
    save_megatron,
    tensor_metadata,
)

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from .workers_ckpt import world_results

    root = world_results(tmp_path_factory.mktemp("checkpoint_world"))
    return root, json.loads((root / "results.json").read_text())


def test_load_restores_saved_weights_and_optimizer_state_bit_for_bit(world):
    _, results = world
    moved = results["moved_after_save"]  # two more steps changed every weight and state entry
    assert any(key.startswith("r0:weight:") for key in moved)
    assert any(key.startswith("r1:exp_avg_sq:") for key in moved)
    assert "r0:lr" in moved
    assert results["load_into_moved_model"] == []
    assert results["load_into_fresh_model"] == []


def test_refused_save_leaves_the_previous_checkpoint_in_place(world):
    """A save with a non-JSON ``extra`` fails before writing anything; the following load
    (above) still gets the earlier checkpoint."""
    root, results = world
    assert "JSON" in results["refused_save_error"]
    assert results["load_into_moved_model"] == []
    assert not (root / ".train_tp2.partial").exists()


def test_resume_equals_uninterrupted_training(world):
    """step, save, two steps == (fresh model, optimizer, schedule) load, the same two steps."""
    assert world[1]["resume_equals_uninterrupted"] == []


def test_tp2_checkpoint_loads_into_tp1_as_the_gathered_weights_and_state(world):
    assert world[1]["tp2_to_tp1"] == []


def test_model_of_another_shape_is_refused_naming_key_and_shapes(world):
    message = world[1]["shape_mismatch_error"]
    assert "decoder.layers.mlp.linear_fc1.weight" in message
    assert "(2, 96, 32)" in message and "(2, 128, 32)" in message


def test_layout_on_disk(world):
    """Global keys with a layer axis; optimizer state sharded like its parameter; the manifest;
    NeMo's prefix in the NeMo-style directory; no staging directory left behind."""
    root, _ = world
    tensors = tensor_metadata(root / "sharded_qwen2")
    assert tensors["decoder.layers.self_attention.linear_qkv.weight"][0] == (4, 64, 32)
    assert tensors["optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight"][0] == (
        4,
        96,
        32,
    )
    assert tensors["embedding.word_embeddings.weight"][0] == (112, 32)  # 100 padded at TP 2
    manifest = json.loads((root / "sharded_qwen2" / MANIFEST).read_text())
    assert manifest["model_prefix"] == "" and manifest["extra"] == {"family": "qwen2"}
    assert manifest["optimizer_state"] == MEGATRON_OPTIMIZER
    llama = tensor_metadata(root / "nemo_llama")
    assert "model.decoder.layers.mlp.linear_fc2.weight" in llama
    assert all(key.startswith("model.") for key in llama)
    assert not list(root.glob(".*partial"))


def test_missing_checkpoint_and_non_json_extra_fail_before_any_collective(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_megatron(tmp_path / "nowhere", torch.nn.Linear(2, 2), None)
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match=MANIFEST):
        load_megatron(tmp_path / "plain", torch.nn.Linear(2, 2), None)
    with pytest.raises(TypeError, match="JSON"):
        save_megatron(tmp_path / "ckpt", torch.nn.Linear(2, 2), None, {"step": torch.zeros(1)})
