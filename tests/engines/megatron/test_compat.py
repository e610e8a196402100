"""``engines/megatron/compat.py`` on the installed megatron-core (0.16.1 in ``.venv``, 0.11 in
the environment of ``scripts/setup_megatron_env.sh``; ``make test`` runs both): each feature
check against what megatron-core itself then does, and the start-up rule it feeds in preflight
and the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opefo_nemo.cli.preflight import main as preflight_main
from opefo_nemo.config.compose import compose
from opefo_nemo.engines.megatron import compat
from opefo_nemo.orchestration.ranks import RankLayoutError
from opefo_nemo.trainer.setup import build_policy
from tests.parallel.world import run_world

from . import workers_compat
from .tiny import hf_config, layout

pytest.importorskip("megatron.core")
ROOT = Path(__file__).resolve().parents[3]
#: The tiny Qwen2 has 2 key/value heads (4 query heads, MLP width 48): TP 4 is above them.
ABOVE = 4


def _tiny_model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(hf_config("qwen2")))
    (model / "model.safetensors").write_bytes(b"")  # start-up checks for the files, unread here
    (model / "tokenizer.json").write_text("{}")
    return model


def _overrides(model: Path, tmp_path: Path) -> list[str]:
    return [
        "engine=aligner",
        f"engine.tensor_model_parallel_size={ABOVE}",
        "model=local",
        f"model.path={model}",
        f"run.output_dir={tmp_path / 'run'}",
    ]


def test_tp_above_kv_heads_probe_agrees_with_the_models_own_config():
    """The probe (2 heads in 1 group at TP 2) answers what the tiny Qwen2's own
    ``TransformerConfig`` (4 heads in 2 groups) does at TP 4: accepted, or ``ValueError``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = layout("qwen2").shape
    try:
        TransformerConfig(
            num_layers=shape.num_layers,
            hidden_size=shape.hidden_size,
            num_attention_heads=shape.num_attention_heads,
            num_query_groups=shape.num_key_value_heads,
            tensor_model_parallel_size=ABOVE,
        )
    except ValueError:
        accepted = False
    else:
        accepted = True
    assert compat.tensor_parallel_above_kv_heads() is accepted


def test_rule_refuses_exactly_what_megatron_core_cannot():
    supported = compat.tensor_parallel_above_kv_heads()
    for tp, groups in [(1, 2), (2, 2), (2, 4), (4, 2), (8, 1)]:
        problem = compat.tensor_parallel_problem(tp, groups)
        assert (problem is None) == (tp <= groups or supported), (tp, groups, problem)
        if problem is not None:
            assert f"tensor_model_parallel_size = {tp}" in problem
            assert f"num_key_value_heads = {groups}" in problem


def test_preflight_reports_the_rule(tmp_path, capsys):
    model = _tiny_model_dir(tmp_path)
    status = preflight_main(["--world-size", str(ABOVE), *_overrides(model, tmp_path)])
    out = capsys.readouterr().out
    assert "engine aligner:" in out, out  # the config composed and was planned
    refused = "exceeds the model's num_key_value_heads = 2" in out
    assert refused == (compat.tensor_parallel_above_kv_heads() is False), out
    if refused:
        assert status == 1
        assert "the installed megatron-core requires tensor parallel to divide" in out


def test_preflight_without_megatron_core_assumes_the_images_0_11(tmp_path):
    """A login node without megatron-core: preflight (in a fresh interpreter where importing
    ``megatron`` fails) refuses TP above the KV heads and says what it assumed."""
    model = _tiny_model_dir(tmp_path)
    script = (
        "import sys; sys.modules['megatron'] = None\n"
        "from opefo_nemo.cli.preflight import main\n"
        f"sys.exit(main({['--world-size', str(ABOVE), *_overrides(model, tmp_path)]!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "megatron-core is not importable here, so this assumes the NeMo 25.02 image's 0.11"
        in result.stdout
    ), result.stdout


def test_trainer_start_up_refuses_what_megatron_core_cannot(tmp_path):
    if compat.tensor_parallel_above_kv_heads():
        pytest.skip("the installed megatron-core runs TP above the KV heads: nothing to refuse")
    model = _tiny_model_dir(tmp_path)
    config, _ = compose(_overrides(model, tmp_path))
    with pytest.raises(RankLayoutError, match="exceeds the model's num_key_value_heads = 2"):
        build_policy(config, model)


def test_embedding_group_is_the_first_and_last_stage(tmp_path):
    """PP 3: stages 0 and 2 share the group (rank sum 0 + 2), the middle stage has none."""
    run_world(workers_compat.embedding_group_sums, 3, str(tmp_path))
    sums = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(3)]
    assert sums == [2.0, None, 2.0]


def test_cpu_ranks_with_the_distributed_optimizer_follow_the_checkpoint_rule(tmp_path, capsys):
    """Preflight and the trainer's start-up refuse CPU ranks with the distributed optimizer
    exactly where this megatron-core cannot checkpoint it (0.11 over torch's AdamW), naming the
    key; elsewhere both accept it."""
    model = _tiny_model_dir(tmp_path)
    overrides = [
        "engine=megatron",
        "engine.device=cpu",
        "engine.use_distributed_optimizer=true",
        "model=local",
        f"model.path={model}",
        f"run.output_dir={tmp_path / 'run'}",
    ]
    status = preflight_main(["--world-size", "1", *overrides])
    out = capsys.readouterr().out
    problem = compat.distributed_optimizer_checkpoint_problem()
    refused = "engine.use_distributed_optimizer with engine.device=cpu" in out
    assert refused == (problem is not None), out
    assert status == (1 if refused else 0), out
    if refused:
        with pytest.raises(RankLayoutError, match=r"engine\.use_distributed_optimizer"):
            build_policy(compose(overrides)[0], model)
