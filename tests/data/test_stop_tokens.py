"""Stop ids: the tokenizer's eos, ``generation_config.json``'s eos ids and the chat template's
end of turn (``data/stop_tokens.py``), on a tiny model shaped like Qwen2.5-Math's base
tokenizer (``chat_model.py``); then completions end at ``<|im_end|>`` in training and in
``opefo-eval`` with real vLLM servers."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from opefo_nemo.cli import eval as eval_cli
from opefo_nemo.config.compose import compose
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.data.stop_tokens import stop_tokens
from opefo_nemo.models.tiny import build_tiny_model
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer
from tests.data.chat_model import ENDOFTEXT, IM_END, build_chat_model, token_ids
from tests.trainer.recording import RecordingRollout

MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return build_chat_model(tmp_path_factory.mktemp("models") / "chat")


def test_derived_stop_ids_name_eos_and_the_chat_templates_end_of_turn(chat_model):
    ids = token_ids(chat_model)
    codec = PromptCodec(chat_model, "raw")
    stop = stop_tokens(codec)
    assert stop.ids == (ids[ENDOFTEXT], ids[IM_END])
    assert stop.sources == ("tokenizer eos", "chat template end of turn")
    described = stop.describe(codec)
    assert f"{ids[IM_END]} '{IM_END}' (chat template end of turn)" in described
    assert stop_tokens(codec, [7, 9]).ids == (7, 9)


def test_generation_config_eos_ids_are_added_once(chat_model, tmp_path):
    copy = tmp_path / "chat"
    shutil.copytree(chat_model, copy)
    ids = token_ids(copy)
    config = json.loads((copy / "generation_config.json").read_text())
    config["eos_token_id"] = [ids[ENDOFTEXT], ids[IM_END], 5]
    (copy / "generation_config.json").write_text(json.dumps(config))
    stop = stop_tokens(PromptCodec(copy, "raw"))
    assert stop.ids == (ids[ENDOFTEXT], ids[IM_END], 5)
    assert stop.sources[1:] == ("generation_config.json eos",) * 2


def test_a_model_without_chat_template_stops_at_its_eos_only(tmp_path):
    model = build_tiny_model(tmp_path / "tiny")
    codec = PromptCodec(model, "raw")
    assert stop_tokens(codec).ids == (codec.eos_id,)


def _assert_ends_at_stop_ids(completions, stop_ids, im_end):
    """Every completion ends right after its first stop id, or at the length limit without one;
    some end at ``<|im_end|>`` (each token is one with probability ≈ 0.13: chat_model.py)."""
    assert completions
    for c in completions:
        stops = [i for i, token in enumerate(c.token_ids) if token in stop_ids]
        if c.finish_reason == "stop":
            assert stops == [len(c.token_ids) - 1], c
        else:
            assert (c.finish_reason, stops, len(c.token_ids)) == ("length", [], MAX_NEW_TOKENS)
    assert any(c.token_ids[-1] == im_end for c in completions)


@pytest.mark.vllm
def test_training_and_opefo_eval_stop_at_im_end(chat_model, tmp_path, caplog):
    ids = token_ids(chat_model)
    stop_ids = {ids[ENDOFTEXT], ids[IM_END]}
    out = tmp_path / "run"
    overrides = [
        "model=local", f"model.path={chat_model}", f"run.output_dir={out}",
        "trainer.prompts_per_step=4", "trainer.responses_per_prompt=4", "trainer.max_steps=2",
        f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "metrics.progress=false",
        "metrics.tensorboard=false", "checkpoint.every=0",
    ]  # fmt: skip
    config, config_dict = compose(overrides)
    with caplog.at_level(logging.INFO):
        trainer = build_trainer(config, config_dict, out)
    assert f"{ids[IM_END]} '{IM_END}' (chat template end of turn)" in caplog.text
    recording = trainer.rollout = RecordingRollout(trainer.rollout)
    try:
        assert trainer.run() == "done"
    finally:
        recording.close()
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == [1, 2]
    _assert_ends_at_stop_ids(recording.completions, stop_ids, ids[IM_END])

    bench = tmp_path / "arith.jsonl"
    rows = [json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) for i in range(4)]
    bench.write_text("\n".join(rows) + "\n")
    args = [str(chat_model), "--file", f"arith={bench}", "--samples", "4",
            "--verifier", "arithmetic", "--max-new-tokens", str(MAX_NEW_TOKENS),
            "--max-model-len", "64",
            "--out", str(tmp_path / "eval")]  # fmt: skip
    assert eval_cli.main(args) == 0
    samples = (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in samples]
    assert len(rows) == 16
    _assert_ends_at_stop_ids([_Sample(**row) for row in rows], stop_ids, ids[IM_END])


class _Sample:
    """A row of ``samples.jsonl`` seen as a completion."""

    def __init__(self, token_ids, finish_reason, **_):
        self.token_ids, self.finish_reason = token_ids, finish_reason

    def __repr__(self) -> str:
        return f"_Sample({self.token_ids}, {self.finish_reason})"
