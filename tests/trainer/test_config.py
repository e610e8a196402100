"""Configuration: composition with NeMo-style overrides and start-up validation naming the key."""

from __future__ import annotations

import pytest

from opefo_nemo.config import method_names
from opefo_nemo.config.compose import compose


def test_defaults_compose_to_the_embedded_task():
    config, data = compose([])
    assert config.method.name == "opefo"
    assert config.data.train == "arithmetic" and config.reward.verifier == "arithmetic"
    assert config.model.embedded
    assert data["run"]["output_dir"] == "outputs/opefo"


def test_stats_kernel_choices():
    assert compose([])[0].engine.stats_kernel == "auto"
    assert compose(["engine.stats_kernel=torch"])[0].engine.stats_kernel == "torch"
    forced = compose(["engine.device=cuda", "engine.stats_kernel=triton"])[0].engine
    assert forced.stats_kernel == "triton"


def test_group_and_value_overrides():
    config, _ = compose(["method=grpo", "trainer.max_steps=7", "++rollout.temperature=0.8"])
    assert config.method.name == "grpo" and config.method.updates_per_rollout == 8
    assert config.trainer.max_steps == 7
    assert config.rollout.temperature == 0.8


@pytest.mark.parametrize("name", method_names())
def test_every_method_file_composes(name):
    config, _ = compose([f"method={name}"])
    assert config.method.name == name


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["+trainer.foo=1"], "trainer.foo"),
        (["+foo=1"], "foo"),
        (["trainer.max_steps=x"], "trainer.max_steps"),
        (["engine.dtype=float16"], "engine.dtype"),
        (
            ["method=grpo", "trainer.prompts_per_step=3", "trainer.responses_per_prompt=3"],
            "method.updates_per_rollout",
        ),
        (["rollout.top_p=0.7"], "rollout.top_p"),
        (["rollout.temperature=0"], "rollout.temperature"),
        (["trainer.responses_per_prompt=1"], "trainer.responses_per_prompt"),
        (["model=local"], "model.path"),
        (["data.long_prompt=truncate"], "data.long_prompt"),
        (["method.lr=-1"], "method.lr"),
        (["++method.foo=1"], "method.foo"),
        (["engine.stats_kernel=fused"], "engine.stats_kernel"),
        (["engine.stats_kernel=triton"], "engine.stats_kernel"),
        (["engine.stats_kernel=fused_linear"], "fused_linear is for engine=megatron or aligner"),
        (["rollout.startup_timeout_s=0"], "rollout.startup_timeout_s"),
        (["rollout.stop_token_ids=[]"], "rollout.stop_token_ids"),
        (["rollout.stop_token_ids=[2,-1]"], "rollout.stop_token_ids"),
        (["rollout.python=''"], "rollout.python"),
        (["run.seed=-1"], "run.seed"),
        (["run.seeds=[0,2,0]"], "run.seeds"),
        (["run.seeds=[1,-2]"], "run.seeds"),
        (["run.seeds=[0.5]"], "run.seeds"),
        (["run.compare=[opefo,grpo_strict,opefo]"], "run.compare"),
        (["metrics.confident_prob=1.0"], "metrics.confident_prob"),
        (["metrics.confident_prob=0"], "metrics.confident_prob"),
        (["model.warm_start_slips=[]"], "model.warm_start_slips"),
        (["model.warm_start_slips=[-1,0]"], "model.warm_start_slips"),
        (
            ["model=tiny_arithmetic_orders", "model.warm_start_swap_rate=1.5"],
            "model.warm_start_swap_rate",
        ),
        (["model.warm_start_carry_first_rate=-0.1"], "model.warm_start_carry_first_rate"),
        (["model.warm_start_separator_rate=0.2"], "model.warm_start_separators"),
        (["model.warm_start_separators=';'"], "model.warm_start_separators"),
        (["model.warm_start_separators=',='"], "model.warm_start_separators"),
        (["model.warm_start_shortcut_rate=1.2"], "model.warm_start_shortcut_rate"),
        (
            ["model=tiny_shortcut", "model.warm_start_shortcut_slip_rate=-0.5"],
            "model.warm_start_shortcut_slip_rate",
        ),
    ],
)
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        compose(overrides)
