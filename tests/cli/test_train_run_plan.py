"""Which runs ``opefo-train`` trains for ``run.compare`` × ``run.seeds``, and where they go."""

from __future__ import annotations

from pathlib import Path

from opefo_nemo.cli.train import plan_runs
from opefo_nemo.config.compose import compose


def planned(overrides):
    config, _ = compose(overrides)
    return [(p.name, p.output_dir, p.overrides) for p in plan_runs(config)]


def test_each_method_once_per_seed_methods_outermost():
    plans = planned(["run.output_dir=out", "run.compare=[grpo_strict,opefo]", "run.seeds=[3,1]"])
    assert [(name, out) for name, out, _ in plans] == [
        ("grpo_strict_seed3", Path("out/grpo_strict/seed_3")),
        ("grpo_strict_seed1", Path("out/grpo_strict/seed_1")),
        ("opefo_seed3", Path("out/opefo/seed_3")),
        ("opefo_seed1", Path("out/opefo/seed_1")),
    ]
    assert plans[1][2] == (
        "run.compare=[]",
        "run.seeds=[]",
        "method=grpo_strict",
        "run.seed=1",
        "run.name=grpo_strict_seed1",
        "run.output_dir=out/grpo_strict/seed_1",
    )


def test_each_planned_run_composes_to_its_method_seed_and_directory():
    """A plan's overrides after the user's give one plain run: no lists left, its own seed."""
    user = ["run.output_dir=out", "run.compare=[grpo_strict,opefo]", "run.seeds=[3,1]"]
    for name, out, extra in planned(user):
        config, _ = compose([*user, *extra])
        assert (config.run.compare, config.run.seeds) == ((), ())
        assert config.run.output_dir == str(out) and config.run.name == name
        assert f"{config.method.name}_seed{config.run.seed}" == name


def test_seeds_without_a_comparison_train_the_selected_method_per_seed():
    plans = planned(["method=clip_higher", "run.seeds=[0,2]"])
    assert [(name, out) for name, out, _ in plans] == [
        ("clip_higher_seed0", Path("outputs/clip_higher/seed_0")),
        ("clip_higher_seed2", Path("outputs/clip_higher/seed_2")),
    ]
    assert all("method=" not in " ".join(extra) for _, _, extra in plans)


def test_a_comparison_without_seeds_keeps_one_directory_per_method():
    plans = planned(["run.name=embedded", "run.compare=[grpo_strict,opefo]", "run.seed=4"])
    assert [(name, out) for name, out, _ in plans] == [
        ("grpo_strict", Path("outputs/embedded/grpo_strict")),
        ("opefo", Path("outputs/embedded/opefo")),
    ]
    assert all("run.seed=" not in " ".join(extra) for _, _, extra in plans)


def test_resuming_a_sequence_starts_the_runs_it_had_not_reached(tmp_path):
    """checkpoint.resume=latest after a pre-emption: the run with a checkpoint resumes, the
    next one (no checkpoint yet) starts from the beginning (auto) instead of failing to resume."""
    done = tmp_path / "grpo_strict" / "checkpoints" / "step_000003"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text('{"step": 3}')
    user = [f"run.output_dir={tmp_path}", "run.compare=[grpo_strict,opefo]"]
    plans = planned([*user, "checkpoint.resume=latest"])
    assert [("checkpoint.resume=auto" in extra) for _, _, extra in plans] == [False, True]
    for _, _, extra in plans:
        config, _ = compose([*user, "checkpoint.resume=latest", *extra])
        expected = "latest" if config.method.name == "grpo_strict" else "auto"
        assert config.checkpoint.resume == expected
