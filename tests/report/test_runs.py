"""Reading run directories and grouping runs by what they recorded, not by their paths."""

from __future__ import annotations

import pytest

from opefo_nemo.report import RunDirectoryError, group_runs, load_run

from .run_dirs import records, run_config, write_run


def constant(key, step):
    return 0.5


def test_groups_come_from_the_recorded_method_and_settings_not_the_directory(tmp_path):
    """Directory names that lie: grouping and labels follow config.yaml. Seeds differ in run.*
    keys only (seed, name, output directory) and group; a different lr is another experiment."""
    made = {
        "opefo_a": ("grpo_strict", 3, ()),
        "opefo_b": ("opefo", 0, ()),
        "x/seed_9": ("grpo_strict", 4, ()),
        "y": ("opefo", 1, ("metrics.progress=false", "checkpoint.every=5")),
        "z": ("opefo", 2, ("method.lr=0.0003",)),
    }
    runs = []
    for name, (method, seed, extra) in made.items():
        path = tmp_path / name
        write_run(path, records(range(1, 4), constant), run_config(method, seed, path, extra))
        runs.append(load_run(path))
    groups = group_runs(runs)
    assert [(g.label, g.seeds) for g in groups] == [
        ("grpo_strict", (3, 4)),
        ("opefo (method.lr=0.0001)", (0, 1)),  # the default model's lr
        ("opefo (method.lr=0.0003)", (2,)),
    ]
    assert [r.path.name for r in groups[1].runs] == ["opefo_b", "y"]


def test_a_run_without_config_reads_its_checkpoint_or_stands_alone(tmp_path):
    old = write_run(tmp_path / "old", records(range(1, 3), constant), None)
    write_run(old / "checkpoints" / "step_000001", [], run_config("opefo", 1, old))
    write_run(old / "checkpoints" / "step_000002", [], run_config("opefo", 5, old))
    bare = write_run(tmp_path / "bare", records(range(1, 3), constant), None)
    fresh = tmp_path / "fresh"
    write_run(fresh, records(range(1, 3), constant), run_config("opefo", 0, fresh))
    runs = [load_run(p) for p in (old, bare, fresh)]
    assert (runs[0].method, runs[0].seed) == ("opefo", 5)  # the newest checkpoint's
    assert (runs[1].method, runs[1].seed) == (None, None)
    groups = group_runs(runs)
    assert [(g.label, g.seeds) for g in groups] == [("opefo", (5, 0)), ("bare", (None,))]


def test_records_are_read_in_step_order_and_nulls_are_left_out(tmp_path):
    steps = [3, 1, 2]
    path = write_run(
        tmp_path / "r",
        records(steps, lambda k, s: None if s == 2 else float(s), ["flow/lambda"]),
        None,
    )
    run = load_run(path)
    logged, values = run.series("flow/lambda")
    assert logged.tolist() == [1, 3] and values.tolist() == [1.0, 3.0]
    assert run.has("flow/lambda") and not run.has("entropy/mean")


def test_unreadable_run_directories_are_errors_naming_them(tmp_path):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(RunDirectoryError, match=r"empty_dir holds no metrics\.jsonl"):
        load_run(tmp_path / "empty_dir")
    with pytest.raises(RunDirectoryError, match="nowhere is not a directory"):
        load_run(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, oops\n')
    with pytest.raises(RunDirectoryError, match=r"broken/metrics\.jsonl:2 is not JSON"):
        load_run(broken)
    (broken / "metrics.jsonl").write_text("\n")
    with pytest.raises(RunDirectoryError, match="empty: the run logged no step"):
        load_run(broken)
    (broken / "metrics.jsonl").write_text('{"reward/mean": 1}\n')
    with pytest.raises(RunDirectoryError, match=":1 is not an object with an integer step"):
        load_run(broken)


def test_a_key_added_later_groups_an_older_run_with_newer_ones_at_its_default(tmp_path):
    """An older run's config.yaml lacks engine.shared_forward: it groups with a run that left the
    key at its default, not with one that set it. A configuration today's validation refuses (a
    key since removed) is compared as recorded and stands apart."""
    older = run_config("opefo", 0, tmp_path / "older")
    del older["engine"]["shared_forward"]
    retired = run_config("opefo", 3, tmp_path / "retired")
    retired["engine"]["retired_key"] = 1
    configs = {
        "older": older,
        "newer": run_config("opefo", 1, tmp_path / "newer"),
        "shared": run_config("opefo", 2, tmp_path / "shared", ("engine.shared_forward=true",)),
        "retired": retired,
    }
    runs = [
        load_run(write_run(tmp_path / name, records(range(1, 3), constant), config))
        for name, config in configs.items()
    ]
    groups = group_runs(runs)
    assert [g.seeds for g in groups] == [(0, 1), (2,), (3,)]
    assert "engine.shared_forward=True" in groups[1].label
    assert "engine.retired_key=1" in groups[2].label
