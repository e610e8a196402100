"""``opefo-export``: sharded checkpoints written by ``save_megatron`` (``MegatronPolicy.save``)
from real TP-2 megatron-core GPTModels with megatron's optimizer state beside them
(``workers_ckpt``), a NeMo-style ``model_weights/`` directory (``model.`` key prefix, no
manifest), and trainer checkpoints of both engines → Hugging Face directories equal to the weights
that were saved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from opefo_nemo.cli.export import main
from opefo_nemo.engines.megatron.checkpoint import MANIFEST
from opefo_nemo.trainer.checkpoint import save_checkpoint

transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    from tests.engines.megatron.workers_ckpt import world_results

    return world_results(tmp_path_factory.mktemp("checkpoint_world"))


def _load(directory: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _assert_same_model(exported: Path, original: torch.nn.Module) -> None:
    """Every weight bit-equal, and the same logits from ``from_pretrained``."""
    model = _load(exported)
    assert model.state_dict().keys() == original.state_dict().keys()
    for name, tensor in original.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    tokens = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, original(tokens).logits)


def _export(*args: object) -> int:
    return main([str(arg) for arg in args])


#: Per family, the TP-2 checkpoint directory: ours for Qwen2, NeMo's layout for Llama.
CHECKPOINTS = {"qwen2": "sharded_qwen2", "qwen2_tied": "sharded_qwen2_tied", "llama": "nemo_llama"}


@pytest.mark.parametrize("family", list(CHECKPOINTS))
def test_sharded_tp2_checkpoint_exports_to_the_original_hf_model(world, family, tmp_path):
    out = tmp_path / "export"
    code = _export(
        world / CHECKPOINTS[family],
        "--hf-model",
        world / f"hf_{family}",
        "--out",
        out,
        "--max-shard-size",
        "100KB",
    )
    assert code == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == sorted(p.name for p in out.glob("model-*.safetensors")) and len(files) > 1
    config = (world / f"hf_{family}" / "config.json").read_text()
    assert (out / "config.json").read_text() == config
    _assert_same_model(out, _load(world / f"hf_{family}"))


def test_nemo_model_weights_directory_with_model_prefix(world, tmp_path):
    """An extracted ``.nemo``-like directory: ``model_weights/`` without our manifest, keys
    under ``model.``, found and its prefix detected."""
    nemo = tmp_path / "nemo"
    shutil.copytree(world / "nemo_llama", nemo / "model_weights")
    assert not (nemo / "model_weights" / MANIFEST).exists()
    (nemo / "model_config.yaml").write_text("precision: bf16\n")
    assert _export(nemo, "--hf-model", world / "hf_llama", "--out", tmp_path / "out") == 0
    _assert_same_model(tmp_path / "out", _load(world / "hf_llama"))


class _CopyPolicy:
    """Writes an existing sharded checkpoint as its ``policy/`` (what the aligner policy's
    ``save`` produces), so the trainer's real ``save_checkpoint`` writes the rest."""

    def __init__(self, sharded: Path) -> None:
        self.sharded = sharded

    def save(self, directory: Path) -> None:
        shutil.copytree(self.sharded, directory)


def test_aligner_trainer_checkpoint_uses_the_runs_model_path(world, tmp_path):
    root = tmp_path / "checkpoints"
    config = {"model": {"path": str(world / "hf_qwen2")}}
    save_checkpoint(root, 3, _CopyPolicy(world / "sharded_qwen2"), {}, config, keep=2)
    assert _export("latest", "--checkpoint-dir", root, "--out", tmp_path / "out") == 0
    _assert_same_model(tmp_path / "out", _load(world / "hf_qwen2"))


def test_hf_engine_trainer_checkpoint_exports_its_trained_weights(world, tmp_path):
    from opefo_nemo.config.engines import EngineConfig
    from opefo_nemo.engines.hf import HFPolicy

    policy = HFPolicy(world / "hf_qwen2", EngineConfig(), lr=1e-3, temperature=1.0)
    with torch.no_grad():  # "trained": the export must take these, not the original's
        for param in policy.model.parameters():
            param.add_(0.01)
    config = {"model": {"path": str(world / "hf_qwen2")}}
    step = save_checkpoint(tmp_path / "checkpoints", 5, policy, {}, config, keep=2)
    assert _export(step, "--out", tmp_path / "out") == 0
    _assert_same_model(tmp_path / "out", policy.model.eval())


def test_errors_are_one_line_and_exit_2(world, tmp_path, capsys):
    def error(*args: object) -> str:
        assert _export(*args) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("opefo-export: error: ")
        return lines[0]

    out = tmp_path / "out"
    assert "does not exist" in error(tmp_path / "missing", "--out", out)
    assert "--checkpoint-dir" in error("latest", "--out", out)
    assert "holds no checkpoint" in error("latest", "--checkpoint-dir", tmp_path, "--out", out)
    assert "--hf-model" in error(world / "nemo_llama", "--out", out)

    wider = tmp_path / "wider"
    shutil.copytree(world / "hf_llama", wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    message = error(world / "nemo_llama", "--hf-model", wider, "--out", out)
    assert "model.decoder.layers.mlp.linear_fc1.weight" in message
    assert "(4, 96, 32)" in message and "(4, 128, 32)" in message
    message = error(world / "hf_llama", "--hf-model", wider, "--out", out)  # safetensors source
    assert "model.layers.0.mlp.gate_proj.weight has shape (48, 32)" in message
    assert "implies (64, 32)" in message
    (wider / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    message = error(world / "nemo_llama", "--hf-model", wider, "--out", out)
    assert "has shape (4, 32)" in message and "implies (2, 32)" in message  # stacked layers
    assert "linear_qkv.bias" in error(
        world / "nemo_llama", "--hf-model", world / "hf_qwen2", "--out", out
    )
    assert not out.exists()

    out.mkdir()
    (out / "stale.txt").write_text("old")
    assert "--overwrite" in error(
        world / "nemo_llama", "--hf-model", world / "hf_llama", "--out", out
    )
    assert (out / "stale.txt").is_file()
    args = (world / "nemo_llama", "--hf-model", world / "hf_llama", "--out", out)
    assert _export(*args, "--overwrite") == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
