"""Where a run starting into ``run.output_dir`` begins (``checkpoint.resume``), on directories
laid out as the trainer writes them: ``checkpoints/step_NNNNNN/trainer_state.json``,
``metrics.jsonl``."""

from __future__ import annotations

import json

import pytest

from opefo_nemo.trainer.checkpoint import ResumeError, holds_run, resume_point


def _checkpoint(run, step):
    path = run / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": step}))
    return path


def test_auto_continues_the_newest_checkpoint_or_starts_at_step_0(tmp_path):
    assert resume_point("auto", tmp_path / "new") is None
    _checkpoint(tmp_path, 2)
    newest = _checkpoint(tmp_path, 10)
    (tmp_path / "checkpoints" / ".step_000012.partial").mkdir()  # a save that never finished
    assert resume_point("auto", tmp_path) == newest
    assert resume_point("latest", tmp_path) == newest


def test_auto_after_a_crash_before_the_first_checkpoint_starts_at_step_0(tmp_path):
    """Metrics but no checkpoint: step 0 (the metrics logger then sets those records aside)."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert holds_run(tmp_path)
    assert resume_point("auto", tmp_path) is None


def test_fresh_refuses_a_directory_that_holds_a_run(tmp_path):
    assert resume_point("fresh", tmp_path / "new") is None
    (tmp_path / "metrics.jsonl").write_text("")
    assert resume_point("fresh", tmp_path) is None  # an empty file is no run
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ResumeError, match=r"fresh but run\.output_dir=.* holds a run"):
        resume_point("fresh", tmp_path)
    only_checkpoints = tmp_path / "other"
    _checkpoint(only_checkpoints, 3)
    with pytest.raises(ResumeError, match="holds a run"):
        resume_point("fresh", only_checkpoints)


def test_latest_needs_a_checkpoint(tmp_path):
    with pytest.raises(ResumeError, match=r"latest but .* holds no checkpoint"):
        resume_point("latest", tmp_path)


def test_a_checkpoint_path_is_refused_behind_a_later_one_of_the_run(tmp_path):
    """Continuing step 2 into a directory that holds step 4 would overwrite steps 3 and 4."""
    source = _checkpoint(tmp_path / "source", 2)
    assert resume_point(str(source), tmp_path / "branch") == source
    own_2, _ = _checkpoint(tmp_path / "run", 2), _checkpoint(tmp_path / "run", 4)
    with pytest.raises(ResumeError, match=r"\(step 2\) .* holds the later step_000004"):
        resume_point(str(own_2), tmp_path / "run")
    assert resume_point(str(tmp_path / "run" / "checkpoints" / "step_000004"), tmp_path / "run")
    with pytest.raises(ResumeError, match="not a checkpoint directory"):
        resume_point(str(tmp_path / "nothing"), tmp_path / "run")


def test_a_run_continues_only_a_run_of_its_own_method_model_and_data(tmp_path):
    """A directory whose checkpoint another method wrote (two methods sharing a preset's default
    directory) is refused; another step count is the same run, trained further."""
    import yaml

    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.inputs import check_run_directory

    opefo, opefo_dict = compose(["method=opefo", f"run.output_dir={tmp_path}"])
    checkpoint = _checkpoint(tmp_path, 3)
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(opefo_dict))
    check_run_directory(opefo, tmp_path)
    longer, _ = compose(["method=opefo", "trainer.max_steps=500", f"run.output_dir={tmp_path}"])
    check_run_directory(longer, tmp_path)
    grpo, _ = compose(["method=grpo_strict", f"run.output_dir={tmp_path}"])
    with pytest.raises(ResumeError, match=r"method\.name=opefo, not grpo_strict"):
        check_run_directory(grpo, tmp_path)
    branch, _ = compose(["method=grpo_strict", f"checkpoint.resume={checkpoint}"])
    check_run_directory(branch, tmp_path / "branch")  # another directory: a new run from it
