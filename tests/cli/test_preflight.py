"""``opefo-preflight`` end to end on the real ``conf/``: composition, report, exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from opefo_nemo.cli.preflight import main

QWEN2_SMALL = {
    "model_type": "qwen2",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 704,
    "vocab_size": 1000,
}


def _model_dir(tmp_path: Path) -> Path:
    """A model directory with QWEN2_SMALL's config and (empty) weight and tokenizer files: what
    preflight reads is the config; of the others, their presence."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN2_SMALL))
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer.json").write_text("{}")
    return model


def _run(capsys, *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    return status, capsys.readouterr().out


def test_tiny_cpu_preset_passes(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPEFO_CKPT_DIR", str(tmp_path))
    status, out = _run(
        capsys,
        "--world-size",
        "1",
        "+preset=tiny_cpu",
        "trainer.max_steps=2",
        "trainer.prompts_per_step=8",
    )
    assert status == 0, out
    assert out.rstrip().endswith("preflight: OK")
    assert "engine hf: 8 prompts × 8 responses" in out


def test_packaged_model_preset_passes_before_its_conversion(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPEFO_CACHE", str(tmp_path / "empty_cache"))  # nothing converted yet
    status, out = _run(capsys, "--world-size", "1", "+preset=smollm2_cpu")
    assert status == 0, out
    assert "engine hf: 32 prompts × 8 responses" in out and "not readable yet" in out


def test_memory_table_for_a_readable_model(capsys, tmp_path):
    model = _model_dir(tmp_path)
    status, out = _run(
        capsys,
        "--world-size=1",
        "--gpu-memory-gib=0",
        "model=local",
        f"model.path={model}",
        f"run.output_dir={tmp_path / 'run'}",
    )
    assert status == 0, out
    assert "per-GPU memory, TP=1 PP=1 DP=1" in out
    assert out.splitlines()[4].strip() == "MiB"  # a small model is shown in MiB
    for row in ("weights", "gradients", "optimizer states", "activations", "vLLM share"):
        assert row in out
    assert "GPU memory" not in out.split("generation phase total")[1]  # CPU: no capacity line
    assert "entropy gradient" not in out
    status, out = _run(
        capsys,
        "--world-size=1",
        "--gpu-memory-gib=0",
        "model=local",
        f"model.path={model}",
        f"run.output_dir={tmp_path / 'run'}",
        "method=entropy_neutral",
    )
    assert status == 0, out
    assert "entropy gradient (the update's correction)" in out
    activations = _row(out, "activations")
    status, out = _run(
        capsys,
        "--world-size=1",
        "--gpu-memory-gib=0",
        "model=local",
        f"model.path={model}",
        f"run.output_dir={tmp_path / 'run'}",
        f"engine.max_tokens_per_micro_batch={4 * 2048}",
    )
    assert status == 0, out
    assert "micro-batches of at most 8192 tokens" in out
    assert _row(out, "activations") != activations


def _row(out: str, name: str) -> str:
    """The memory table's line of ``name``."""
    (line,) = [line for line in out.splitlines() if line.strip().startswith(name)]
    return line


def test_every_problem_printed_and_exit_status(capsys, tmp_path):
    model = _model_dir(tmp_path)
    status, out = _run(
        capsys,
        "--world-size=3",
        "model=local",
        f"model.path={model}",
        f"data.train={tmp_path / 'missing.jsonl'}",
        "data.validation=null",
        "engine.micro_batch_size=5",
        "trainer.prompts_per_step=8",
        "trainer.responses_per_prompt=8",
    )
    assert status == 1
    problems = [line for line in out.splitlines() if line.startswith("[")]
    assert problems == [
        "[layout] engine 'hf' trains in one process, but the allocation has 3 tasks: request "
        "one task (--ntasks-per-node=1, one node)",
        f"[paths] data path {tmp_path / 'missing.jsonl'} is not readable",
    ]
    assert out.rstrip().endswith("preflight: 2 problem(s)")


def test_paper_preset_is_accepted_but_for_its_missing_files(capsys):
    status, out = _run(capsys, "--world-size=32", "--gpu-memory-gib=80", "+preset=opefo_7b")
    assert status == 1
    assert "engine megatron: 32 prompts × 8 responses, micro-batch 1" in out
    problems = [line for line in out.splitlines() if line.startswith("[")]
    assert problems and all(line.startswith("[paths] ") for line in problems), problems


def test_colocated_rollout_placement_is_reported_and_checked(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    status, out = _run(capsys, "--world-size=32", "+preset=opefo_7b", "engine.rollout_tp_size=2")
    assert "world size 32 (8 per node)" in out
    assert "rollout: 16 colocated vLLM server(s), tensor parallel 2 each" in out
    assert not [line for line in out.splitlines() if line.startswith("[rollout]")]
    status, out = _run(
        capsys,
        "--world-size=32",
        "--gpus-per-node=6",
        "+preset=opefo_7b",
        "engine.rollout_tp_size=4",
    )
    assert status == 1
    assert "[rollout] world size 32 is not a whole number of nodes of 6 GPUs" in out


def test_config_validation_errors_are_problems(capsys):
    status, out = _run(capsys, "trainer.responses_per_prompt=1")
    assert status == 1
    assert "[config] trainer.responses_per_prompt must be >= 2" in out


def test_composition_errors_are_one_line_problems(capsys):
    status, out = _run(capsys, "+preset=opefo_9b")
    assert status == 1
    expected = (
        "Could not find 'preset/opefo_9b' (available: opefo_4b, opefo_7b, smollm2_cpu, tiny_cpu)"
    )
    assert f"[config] cannot compose the config: {expected}" in out
    status, out = _run(capsys, "trainer.max_stepz=3")
    assert status == 1
    assert "[config] cannot compose the config: unknown key trainer.max_stepz" in out
    assert "Config search path" not in out and "To append" not in out


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "opefo-preflight"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--world-size" in result.stdout
