"""``save_megatron`` / ``load_megatron`` (what ``MegatronPolicy.save`` / ``load`` run) and
``opefo-export`` on pipeline-split (PP 2) megatron-core GPTModels in megatron's
``DistributedDataParallel`` with megatron's optimizer, over 2 gloo ranks, untied and tied
embeddings (the world in ``workers_pp_ckpt`` runs once; each test asserts its own records)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opefo_nemo.cli.export import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

FAMILIES = ("qwen2", "qwen2_tied")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, dict]:
    from .workers_pp_ckpt import world_results

    root = world_results(tmp_path_factory.mktemp("pp_checkpoint_world"))
    return root, json.loads((root / "results.json").read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_checkpoint_loads_into_a_fresh_pp2_model_bit_for_bit(world, family):
    results = world[1]
    before = results[f"pp2_fresh_differs_{family}"]  # the fresh model really was different
    for rank in (0, 1):
        assert any(key.startswith(f"r{rank}:weight:decoder.layers.") for key in before)
        assert any(key.startswith(f"r{rank}:exp_avg_sq:") for key in before)
    assert "r0:weight:embedding.word_embeddings.weight" in before
    assert "r1:weight:output_layer.weight" in before
    assert results[f"pp2_to_pp2_{family}"] == []
    assert results[f"pp2_extra_{family}"] == []


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_checkpoint_loads_into_pp1_as_the_stages_tensors(world, family):
    """Resharding PP 2 → PP 1 × DP 2: global layer indices, embedding, final norm, output layer
    and their AdamW state land where the unsplit model has them."""
    assert world[1][f"pp2_to_pp1_{family}"] == []


def test_mismatched_pipeline_model_is_refused_on_every_stage(world):
    """Only the last stage sees the problem, yet both ranks raise it (no rank is left waiting in
    ``dist_checkpointing.load``)."""
    results = world[1]
    for message in results["refuse_tied_into_untied"]:
        assert "has no output_layer.weight" in message and "(on rank 1)" in message
    for message in results["refuse_untied_into_tied"]:
        assert "holds model tensors the model lacks: output_layer.weight" in message


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_checkpoint_exports_to_the_original_hf_model(world, family, tmp_path):
    root, _ = world
    out = tmp_path / "export"
    source, hf_dir = root / f"pp2_{family}", root / f"hf_{family}"
    code = main([str(source), "--hf-model", str(hf_dir), "--out", str(out)])
    assert code == 0
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    original = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    assert exported.state_dict().keys() == original.state_dict().keys()
    for name, tensor in original.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name
