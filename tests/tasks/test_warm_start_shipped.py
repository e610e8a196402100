"""The warm starts shipped with the package (the demo's model and the first task's): made with the
recipes their configurations describe, copied (not built) into an empty cache, built instead when
asked or when the recipe differs, and a model that does the demo's task as documented."""

from __future__ import annotations

import math

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.tasks import embedded_model as embedded
from opefo_nemo.tasks.warm_start import read_recipe
from opefo_nemo.trainer.inputs import warm_start_recipe
from opefo_nemo.trainer.setup import build_trainer, embedded_model

SMALL = ["model.warm_start.steps=2", "model.warm_start.batch_size=4"]


def files(directory) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("model", ["tiny_arithmetic_orders", "tiny_arithmetic"])
def test_the_shipped_warm_start_is_the_configured_recipes(model):
    """Changing conf/model/<model>.yaml's warm start (or the data that draws its problems)
    without shipping the model it makes fails here; another recipe gets no shipped copy."""
    shipped = embedded.SHIPPED / model
    recipe = warm_start_recipe(compose([f"model={model}"])[0])
    assert read_recipe(shipped) == recipe
    assert embedded.shipped_warm_start(model, recipe) == shipped
    assert embedded.shipped_warm_start("tiny_shortcut", recipe) is None  # none shipped
    other = warm_start_recipe(compose([f"model={model}", "model.warm_start.steps=1999"])[0])
    assert embedded.shipped_warm_start(model, other) is None


def test_an_empty_cache_gets_the_shipped_copy_not_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("OPEFO_CACHE", str(tmp_path))
    path = embedded_model(compose([])[0])
    assert path == tmp_path / "tiny_arithmetic_orders"
    assert files(path) == files(embedded.SHIPPED / "tiny_arithmetic_orders")
    assert not (tmp_path / "tiny_arithmetic_orders.base").exists()  # a build starts there


def test_shipped_or_built_as_configured(tmp_path, monkeypatch):
    """With a small recipe's warm start in the shipped place: copied when ``shipped_warm_start``
    is true, built when false (the same bytes: the build is seeded) or when the recipe differs."""
    monkeypatch.setenv("OPEFO_CACHE", str(tmp_path / "made"))
    made = embedded_model(compose([*SMALL, "model.warm_start.seed=1"])[0])
    shipped = tmp_path / "shipped"
    (shipped / made.name).parent.mkdir()
    made.rename(shipped / made.name)
    recipe = read_recipe(shipped / made.name)
    assert recipe is not None
    monkeypatch.setattr(embedded, "SHIPPED", shipped)
    for cache, use in (("copied", "true"), ("built", "false")):
        monkeypatch.setenv("OPEFO_CACHE", str(tmp_path / cache))
        config = compose([*SMALL, "model.warm_start.seed=1", f"model.shipped_warm_start={use}"])
        path = embedded_model(config[0])
        assert read_recipe(path) == recipe
        assert files(path) == files(shipped / made.name)
        assert (tmp_path / cache / f"{made.name}.base").exists() == (use == "false")
    monkeypatch.setenv("OPEFO_CACHE", str(tmp_path / "other"))
    path = embedded_model(compose([*SMALL, "model.warm_start.seed=2"])[0])
    assert read_recipe(path) != recipe and (tmp_path / "other" / f"{made.name}.base").exists()


def test_the_shipped_model_does_the_demos_task_as_documented(tmp_path, monkeypatch):
    """One rollout batch of the shipped model (64 prompts × 8, the demo's sampling): its
    samples are worked solutions with a final answer, and about a third are right
    (docs/training.md: 0.33 at the first rollout step). The band is ±4 standard errors of a
    mean over 64 prompts whose 8 samples may all agree (the widest case), so another machine's
    rounding cannot leave it; an untrained model scores 0, an over-trained one near 1."""
    monkeypatch.setenv("OPEFO_CACHE", str(tmp_path / "cache"))
    prompts, documented = 64, 0.33
    overrides = [
        "rollout=engine",
        f"trainer.prompts_per_step={prompts}",
        f"run.output_dir={tmp_path / 'run'}",
        "metrics.progress=false",
        "metrics.tensorboard=false",
    ]
    config, config_dict = compose(overrides)
    trainer = build_trainer(config, config_dict, tmp_path / "run")
    metrics = trainer.collect().metrics
    band = 4 * math.sqrt(documented * (1 - documented) / prompts)
    assert metrics["reward/mean"] == pytest.approx(documented, abs=band)
    assert metrics["reward/no_answer_frac"] <= 0.05
