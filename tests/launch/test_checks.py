"""Each preflight problem is detected, all of them are reported together, a sound plan has none."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from opefo_nemo.launch import GIB, LaunchPlan, MemorySettings, ModelShape, all_problems
from opefo_nemo.launch.checks import check_engine, check_memory, plan_memory, plan_problems

# Qwen2.5-Math-7B's published config.json values (the estimate needs only these).
QWEN25_7B = ModelShape(
    hidden_size=3584,
    num_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=18944,
    vocab_size=152064,
    qkv_bias=True,
)


@pytest.fixture
def plan(tmp_path) -> LaunchPlan:
    """A sound plan: 32 ranks, TP 2, 32 prompts × 8 responses, paths that exist."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (model / "model.safetensors").write_bytes(b"")  # the files' presence is what is checked
    (model / "tokenizer.json").write_text("{}")
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    return LaunchPlan(
        world_size=32,
        tensor_parallel=2,
        pipeline_parallel=1,
        micro_batch_size=1,
        prompts_per_step=32,
        responses_per_prompt=8,
        updates_per_rollout=1,
        memory=MemorySettings(sequence_length=4096, vllm_memory_fraction=0.4),
        engine="aligner",  # a multi-process engine; its availability is test_missing_engine's
        sequence_parallel=True,
        shape=QWEN25_7B,
        gpu_memory_bytes=80 * GIB,
        model_path=str(model),
        data_paths=(str(data),),
        checkpoint_dir=str(tmp_path / "checkpoints" / "run"),
    )


def _topics(plan: LaunchPlan) -> list[str]:
    return [problem.topic for problem in plan_problems(plan)]


def test_sound_plan_has_no_problem(plan):
    assert plan_problems(plan) == []


def test_world_size_not_divisible_by_model_parallel(plan):
    problems = plan_problems(dataclasses.replace(plan, world_size=31))
    assert [p.topic for p in problems] == ["layout"]
    assert "world size 31" in problems[0].message and "2 = 2" not in problems[0].message


def test_heads_and_layers_must_split(plan):
    problems = plan_problems(
        dataclasses.replace(plan, world_size=24, tensor_parallel=8, pipeline_parallel=3)
    )
    messages = [p.message for p in problems if p.topic == "layout"]
    assert [p.topic for p in problems] == ["layout"] * 2
    assert any("num_attention_heads = 28" in m for m in messages)  # 28 % 8
    assert any("num_layers = 28" in m for m in messages)  # 28 % 3
    assert len(messages) == 2  # TP 8 is a multiple of the 4 key/value heads: allowed


def test_key_value_heads_and_tensor_parallel_must_nest(plan):
    """megatron-core 0.16 accepts TP dividing the key/value heads or a multiple of them (its
    TransformerConfig check), and so does the aligner engine's config; preflight agrees."""
    from opefo_nemo.models.megatron_weights import MegatronLayout

    for groups, tp, fits in [(4, 2, True), (4, 4, True), (2, 4, True), (3, 2, False)]:
        shape = dataclasses.replace(
            QWEN25_7B, num_key_value_heads=groups, num_attention_heads=12, intermediate_size=96
        )
        problems = plan_problems(
            dataclasses.replace(plan, world_size=4 * tp, tensor_parallel=tp, shape=shape)
        )
        layout_messages = [p.message for p in problems if p.topic == "layout"]
        assert (layout_messages == []) == fits, layout_messages
        if not fits:
            assert "num_key_value_heads = 3 and tensor parallel 2" in layout_messages[0]
        try:
            MegatronLayout(shape, tensor_parallel=tp)
        except ValueError:
            assert not fits
        else:
            assert fits


def test_colocated_rollout_must_fit_nodes_and_heads(plan):
    two_nodes = dataclasses.replace(plan, gpus_per_node=8, world_size=16)
    assert plan_problems(dataclasses.replace(two_nodes, rollout_tp_size=4)) == []
    problems = plan_problems(dataclasses.replace(two_nodes, rollout_tp_size=3))
    assert [p.topic for p in problems] == ["rollout"] * 3
    assert "rollout_tp_size 3 does not divide the 8 GPUs of a node" in problems[0].message
    assert "num_attention_heads = 28" in problems[1].message  # 28 % 3
    assert "num_key_value_heads = 4" in problems[2].message  # neither of 3, 4 divides the other
    problems = plan_problems(dataclasses.replace(two_nodes, rollout_tp_size=16))
    assert any("does not divide the 8 GPUs" in p.message for p in problems)
    single = dataclasses.replace(plan, engine="hf", world_size=1, rollout_tp_size=3)
    assert "rollout" not in _topics(single)  # the hf engine's vLLM is not colocated


def test_batch_splits_into_mini_batches(plan):
    assert _topics(dataclasses.replace(plan, updates_per_rollout=3)) == ["batch"]  # 256 / 3
    problems = plan_problems(dataclasses.replace(plan, updates_per_rollout=0))
    assert [p.topic for p in problems] == ["batch"]
    assert "must be positive" in problems[0].message
    # Any count of micro-batches splits over the ranks: 256 responses over DP 16 × micro-batch 3
    # leave ranks with 6 and 5 micro-batches (the engines scale each rank's loss by its count).
    assert _topics(dataclasses.replace(plan, micro_batch_size=3)) == []
    assert _topics(dataclasses.replace(plan, updates_per_rollout=8, micro_batch_size=4)) == []


def test_unreadable_paths(plan, tmp_path):
    empty_model = tmp_path / "empty"
    empty_model.mkdir()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    bad = dataclasses.replace(
        plan,
        model_path=str(empty_model),
        data_paths=(str(tmp_path / "missing.jsonl"), *plan.data_paths),
        resume_path=str(tmp_path / "no-checkpoint"),
        checkpoint_dir=str(locked / "run"),
    )
    messages = [p.message for p in plan_problems(bad)]
    no_config = f"model.path={empty_model} is not a Hugging Face model directory (no config.json)"
    assert no_config in messages
    assert f"data path {tmp_path / 'missing.jsonl'} is not readable" in messages
    assert f"resume checkpoint {tmp_path / 'no-checkpoint'} is not readable" in messages
    if os.geteuid() != 0:  # root writes anywhere
        assert f"checkpoint directory {locked / 'run'} is not writable" in messages
    assert len(messages) == (4 if os.geteuid() != 0 else 3)
    missing_model = dataclasses.replace(plan, model_path=str(tmp_path / "nowhere"))
    assert [p.message for p in plan_problems(missing_model)] == [
        f"model.path={tmp_path / 'nowhere'} does not exist"
    ]


def test_memory_that_does_not_fit(plan):
    estimate = plan_memory(plan)
    assert estimate is not None and estimate.peak <= plan.gpu_memory_bytes
    small_gpu = dataclasses.replace(plan, gpu_memory_bytes=32 * GIB)
    problems = check_memory(small_gpu)
    assert [p.topic for p in problems] == ["memory"]
    assert "(generation phase) exceeds the GPU's 32.0 GiB" in problems[0].message
    # Without the distributed optimizer the 7B states (12 B/param over TP 2) no longer fit.
    plain = dataclasses.replace(plan.memory, distributed_optimizer=False)
    assert _topics(dataclasses.replace(plan, memory=plain)) == ["memory"]


def test_missing_engine(plan):
    assert check_engine(dataclasses.replace(plan, engine="hf")) == []
    problems = all_problems(dataclasses.replace(plan, engine="no_such_engine"))
    assert [p.topic for p in problems] == ["engine"]
    assert "opefo_nemo.engines.no_such_engine" in problems[0].message


def test_every_problem_is_reported_at_once(plan, tmp_path):
    everything = dataclasses.replace(
        plan,
        world_size=31,
        engine="no_such_engine",
        shape=dataclasses.replace(QWEN25_7B, vocab_size=151936),
        updates_per_rollout=5,
        data_paths=(str(tmp_path / "missing.jsonl"),),
    )
    topics = [problem.topic for problem in all_problems(everything)]
    assert topics == ["engine", "layout", "batch", "paths"]
    # Memory is checked once the layout is valid.
    fits_nowhere = dataclasses.replace(everything, world_size=32, gpu_memory_bytes=10 * GIB)
    topics = [problem.topic for problem in all_problems(fits_nowhere)]
    assert topics == ["engine", "batch", "paths", "memory"]


def test_single_process_engine_needs_one_task(plan):
    one = dataclasses.replace(plan, engine="hf", world_size=1, tensor_parallel=1)
    assert plan_problems(dataclasses.replace(one, gpu_memory_bytes=0)) == []
    problems = plan_problems(dataclasses.replace(one, world_size=2, gpu_memory_bytes=0))
    assert [p.topic for p in problems] == ["layout"]
    assert "engine 'hf' trains in one process" in problems[0].message
