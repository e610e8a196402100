"""A run directory is never cut back: a second run into it continues the first (every earlier
line of ``metrics.jsonl`` and every TensorBoard event file kept), ``checkpoint.resume=fresh`` and a
checkpoint behind the directory's newest are refused before anything is written, and a run that
trains no step (``trainer.max_steps=0``, the node check of docs/cluster.md) writes no checkpoint.
"""

from __future__ import annotations

import pytest

from opefo_nemo.trainer.checkpoint import ResumeError, list_checkpoints
from opefo_nemo.trainer.metrics_log import read_metrics

pytestmark = pytest.mark.vllm


def _snapshot(run):
    """Every file under ``run`` with its bytes (the checkpoints' policies left out: large)."""
    return {
        p.relative_to(run): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and "policy" not in p.parts
    }


def test_a_second_run_into_the_same_directory_continues_the_first(make_trainer, tmp_path):
    run = tmp_path / "run"
    tensorboard = ["metrics.tensorboard=true"]
    first = make_trainer([*tensorboard, "trainer.max_steps=2"], run)
    assert first.run() == "done"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    events = {p.name: p.read_bytes() for p in (run / "tensorboard").iterdir()}
    assert [c.name for c in list_checkpoints(run / "checkpoints")] == ["step_000002"]

    second = make_trainer([*tensorboard, "trainer.max_steps=4"], run)  # checkpoint.resume=auto
    assert second.step == 2
    assert second.run() == "done"
    after = (run / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == lines, "every earlier line is kept, byte for byte"
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]
    kept = {p.name: p.read_bytes() for p in (run / "tensorboard").iterdir() if p.name in events}
    assert kept == events and len(list((run / "tensorboard").iterdir())) == len(events) + 1
    assert not (run / "metrics.superseded.jsonl").exists()

    before = _snapshot(run)
    with pytest.raises(ResumeError, match=r"checkpoint\.resume=fresh .* holds a run"):
        make_trainer(["checkpoint.resume=fresh", "trainer.max_steps=4"], run)
    older = run / "checkpoints" / "step_000002"
    with pytest.raises(ResumeError, match=r"holds the later step_000004"):
        make_trainer([f"checkpoint.resume={older}", "trainer.max_steps=4"], run)
    assert _snapshot(run) == before, "a refused start writes nothing"


def test_a_run_that_trains_no_step_writes_no_checkpoint(make_trainer, tmp_path):
    run = tmp_path / "dry"
    trainer = make_trainer(["trainer.max_steps=0", "checkpoint.every=10"], run)
    assert trainer.run() == "done"
    assert list_checkpoints(run / "checkpoints") == []
    assert read_metrics(run / "metrics.jsonl") == []
