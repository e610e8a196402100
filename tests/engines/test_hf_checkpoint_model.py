"""The hf engine's checkpoint model directory loads on its own: with the source's tokenizer and
chat template whether they sit beside ``config.json`` (a Hugging Face download's layout) or in a
``tokenizer/`` folder (the tiny models'), and with the trained weights, never the source's."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.engines.hf import MODEL_SUBDIR, HFPolicy
from opefo_nemo.models.directory import TOKENIZER_SUBDIR, model_files_problem
from tests.trainer.update_inputs import ENGINE

CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
"""A chat template of this test's own, so the checkpoint's can be told from a default."""
TEXT = "What is 18 * 7? 126"


@pytest.fixture(scope="module", params=["beside_config", "tokenizer_folder"])
def source(request, tiny_model_dir, tmp_path_factory):
    """A copy of the tiny model with a chat template, its tokenizer laid out as
    ``request.param`` says."""
    root = tmp_path_factory.mktemp("source") / "tiny"
    shutil.copytree(tiny_model_dir, root)
    folder = root / TOKENIZER_SUBDIR
    (folder / "chat_template.jinja").write_text(CHAT)
    if request.param == "beside_config":
        for entry in folder.iterdir():
            shutil.move(entry, root / entry.name)
        folder.rmdir()
    return root


def test_a_saved_checkpoint_model_loads_with_the_source_tokenizer_and_trained_weights(
    source, tmp_path
):
    policy = HFPolicy(source, ENGINE, lr=1e-3, temperature=1.0)
    with torch.no_grad():
        for master in policy.weights.masters:
            master.add_(1.0)  # the weights saved are these, not the source's
    policy.save(tmp_path / "policy")
    saved = tmp_path / "policy" / MODEL_SUBDIR

    assert model_files_problem(saved, "the checkpoint") is None
    theirs, ours = PromptCodec(source, "raw"), PromptCodec(saved, "raw")
    assert ours.tokenizer.chat_template == theirs.tokenizer.chat_template == CHAT
    assert ours.tokenizer(TEXT)["input_ids"] == theirs.tokenizer(TEXT)["input_ids"]
    assert (ours.eos_id, ours.pad_id) == (theirs.eos_id, theirs.pad_id)

    weights = load_file(saved / "model.safetensors")
    named = dict(policy.model.named_parameters())
    masters = dict(zip(policy.weights.params, policy.weights.masters, strict=True))
    for name, tensor in weights.items():
        assert torch.equal(tensor, masters[named[name]]), name
    assert sorted(p.name for p in saved.glob("*.safetensors")) == ["model.safetensors"]
