"""Configuration: composition with NeMo-style overrides and start-up validation naming the key."""

from __future__ import annotations

import pytest

from opefo_nemo.cli.train import EMBEDDED_DEFAULT
from opefo_nemo.config import method_names
from opefo_nemo.config.compose import compose


def test_defaults_compose_to_the_embedded_task():
    config, data = compose([])
    assert config.method.name == "opefo"
    assert config.data.train == "arithmetic" and config.reward.verifier == "arithmetic"
    assert config.model.embedded
    assert data["run"]["output_dir"] == "outputs/opefo"


def test_the_default_model_and_its_settings_hold_whatever_else_is_overridden():
    """Bare ``opefo-train`` (EMBEDDED_DEFAULT), ``opefo-probe`` (no override) and a user's
    ``method=grpo_strict trainer.max_steps=50`` all train the demo's model with the settings its
    file sets; the bare command adds only the comparison and its generation (rollout=engine); the
    command line wins over the file; the first task keeps conf/config.yaml's settings and the
    method's lr."""
    assert {o.split("=")[0] for o in EMBEDDED_DEFAULT} == {"run.name", "run.compare", "rollout"}
    bare, probe = compose(list(EMBEDDED_DEFAULT))[0], compose([])[0]
    user = compose(["method=grpo_strict", "trainer.max_steps=50"])[0]
    for config in (bare, probe, user):
        assert config.model.path.endswith("/tiny_arithmetic_orders") and config.model.embedded
        assert config.method.lr == pytest.approx(1e-4)
        assert (config.engine.micro_batch_size, config.engine.warmup_steps) == (256, 10)
        assert config.trainer.prompts_per_step == 32
    assert (bare.trainer.max_steps, probe.trainer.max_steps, user.trainer.max_steps) == (
        140,
        140,
        50,
    )
    assert bare.run.compare == ("grpo_strict", "opefo") and user.method.name == "grpo_strict"
    assert (bare.rollout.name, probe.rollout.name, user.rollout.name) == ("engine", "vllm", "vllm")
    assert compose(["method.lr=3e-4"])[0].method.lr == pytest.approx(3e-4)
    first = compose(["model=tiny_arithmetic"])[0]
    assert first.model.path.endswith("/tiny_arithmetic") and first.model.warm_start.steps == 500
    assert first.method.lr == pytest.approx(2.83e-6)
    assert (first.trainer.max_steps, first.trainer.prompts_per_step) == (80, 16)
    assert first.engine.micro_batch_size == 16


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
        (["method=grpo", "engine.shared_forward=true"], "engine.shared_forward"),
        (["engine=megatron", "+engine.shared_forward=true"], "engine.shared_forward"),
        (["engine.attention=flash"], "engine.attention"),
        (["engine=megatron", "+engine.attention=eager"], "engine.attention"),
        (["rollout.top_p=0.7"], "rollout.top_p"),
        (["rollout.temperature=0"], "rollout.temperature"),
        (["trainer.responses_per_prompt=1"], "trainer.responses_per_prompt"),
        (["trainer.dynamic_sampling_max_rounds=0"], "trainer.dynamic_sampling_max_rounds"),
        (
            [
                "trainer.dynamic_sampling=true",
                "trainer.prompts_per_step=32",
                "trainer.responses_per_prompt=8",
                "trainer.dynamic_sampling_max_rounds=40",  # 40 × 256 seeds > 10 000
            ],
            "trainer.dynamic_sampling_max_rounds",
        ),
        (["trainer.dynamic_sampling=1"], "trainer.dynamic_sampling"),
        (["model=local"], "model.path"),
        (["data.long_prompt=truncate"], "data.long_prompt"),
        (["method.lr=-1"], "method.lr"),
        (["++method.foo=1"], "method.foo"),
        (["engine.stats_kernel=fused"], "engine.stats_kernel"),
        (["engine.stats_kernel=triton"], "engine.stats_kernel"),
        (["engine.stats_kernel=fused_linear"], "fused_linear is for engine=megatron or aligner"),
        (["engine.batch_layout=sorted"], "engine.batch_layout"),
        (["engine.max_tokens_per_micro_batch=0"], "engine.max_tokens_per_micro_batch"),
        (["rollout.startup_timeout_s=0"], "rollout.startup_timeout_s"),
        (["rollout.request_timeout_s=0"], "rollout.request_timeout_s"),
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
        (["model.warm_start.slips=[]"], "model.warm_start.slips"),
        (["model.warm_start.slips=[-1,0]"], "model.warm_start.slips"),
        (["model.warm_start.swap_rate=1.5"], "model.warm_start.swap_rate"),
        (["model.warm_start.carry_first_rate=-0.1"], "model.warm_start.carry_first_rate"),
        (
            ["model=tiny_arithmetic", "model.warm_start.separator_rate=0.2"],
            "model.warm_start.separators",
        ),
        (["model.warm_start.separators=';'"], "model.warm_start.separators"),
        (["model.warm_start.separators=',='"], "model.warm_start.separators"),
        (["+model.warm_start_steps=10"], "model.warm_start_steps"),
        (["model.warm_start.steps=0"], "model.warm_start.steps"),
        (["model.warm_start.shortcut_rate=1.2"], "model.warm_start.shortcut_rate"),
        (
            ["model=tiny_shortcut", "model.warm_start.shortcut_slip_rate=-0.5"],
            "model.warm_start.shortcut_slip_rate",
        ),
    ],
)
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        compose(overrides)


def test_a_token_budget_holds_the_longest_row_and_steers_micro_batch_scope_keeps_the_layout():
    """``engine.max_tokens_per_micro_batch`` below ``data.max_prompt_tokens +
    rollout.max_new_tokens`` (rounded up to the sequence-parallel multiple) is refused, and a
    method taking a statistic per micro-batch needs the contiguous layout (spec §11)."""
    lengths = ["data.max_prompt_tokens=30", "rollout.max_new_tokens=20"]
    assert (
        compose([*lengths, "engine.max_tokens_per_micro_batch=50"])[
            0
        ].engine.max_tokens_per_micro_batch
        == 50
    )
    with pytest.raises(
        ValueError, match=r"engine\.max_tokens_per_micro_batch \(49\) must hold .* = 50$"
    ):
        compose([*lengths, "engine.max_tokens_per_micro_batch=49"])
    megatron = [
        "engine=megatron",
        "engine.tensor_model_parallel_size=4",
        "engine.sequence_parallel=true",
    ]
    with pytest.raises(ValueError, match="rounded up to the sequence-parallel multiple 4: 52"):
        compose([*lengths, *megatron, "engine.max_tokens_per_micro_batch=51"])
    assert (
        compose([*lengths, *megatron, "engine.max_tokens_per_micro_batch=52"])[
            0
        ].engine.sequence_multiple
        == 4
    )
    scoped = ["method=steer", "method.steer.scope=micro_batch"]
    with pytest.raises(ValueError, match=r"engine\.batch_layout is balanced, but method 'steer'"):
        compose(scoped)
    with pytest.raises(ValueError, match=r"with engine\.max_tokens_per_micro_batch=64"):
        compose([*scoped, "engine.batch_layout=contiguous", "engine.max_tokens_per_micro_batch=64"])
    assert (
        compose([*scoped, "engine.batch_layout=contiguous"])[0].engine.batch_layout == "contiguous"
    )
