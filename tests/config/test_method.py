"""conf/method/*.yaml load into validated MethodConfigs; bad keys and values fail by name."""

from __future__ import annotations

import pytest

from opefo_nemo.config import load_method, method_names
from opefo_nemo.core.objectives import registered_objectives


def test_every_registered_objective_has_a_method_file_with_the_paper_settings():
    assert method_names() == registered_objectives()
    strict = {
        "grpo_strict",
        "opefo",
        "static",
        "pos_only",
        "neg_only",
        "entropy_neutral",
        "correct_only",
        "incorrect_only",
    }
    for name in method_names():
        cfg = load_method(name)
        assert cfg.name == name
        assert cfg.updates_per_rollout == (1 if name in strict else 8)
        assert cfg.lr == pytest.approx(2.83e-6 if name in strict else 1e-6)
    assert load_method("clip_higher").clip_eps_high == pytest.approx(0.28)
    assert load_method("entropy_reg").entropy_coef == pytest.approx(0.01)
    assert load_method("opefo").entropy_flow.balance == "adaptive"
    assert load_method("static").entropy_flow.static_lambda == pytest.approx(0.001)
    assert load_method("clip_cov").clip_cov.ratio == pytest.approx(2e-4)
    assert load_method("kl_cov").kl_cov.ratio == pytest.approx(2e-3)
    steer = load_method("steer")  # STEER's published linear runs
    assert (steer.clip_eps_low, steer.clip_eps_high, steer.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert (steer.steer.mapping, steer.steer.weight_min, steer.steer.weight_max) == (
        "linear",
        0.8,
        1.2,
    )
    for name in ("grpo", "clip_higher", "entropy_reg"):  # verl's default dual clip
        assert load_method(name).clip_ratio_c == pytest.approx(3.0)
    assert load_method("clip_cov").clip_ratio_c is None  # Cui et al.'s Clip-Cov has none
    assert load_method("grpo", ["clip_ratio_c=null"]).clip_ratio_c is None
    target = load_method(
        "opefo", ["entropy_flow.balance=target", "entropy_flow.target_entropy=0.5"]
    )
    assert target.entropy_flow.target_entropy == pytest.approx(0.5)
    assert load_method("opefo", ["entropy_flow.balance=target"]).entropy_flow.target_entropy == (
        "initial"
    )


@pytest.mark.parametrize(
    ("name", "override", "message"),
    [
        ("opefo", "entropy_flow.estimtor=tabular", r"unknown key method\.entropy_flow\.estimtor"),
        ("opefo", "learning_rate=1e-6", r"unknown key method\.learning_rate"),
        ("grpo", "clip_eps_low=0", r"method\.clip_eps_low must be > 0"),
        ("grpo", "clip_eps_high=-0.1", r"method\.clip_eps_high must be > 0"),
        ("clip_cov", "clip_cov.ratio=1.5", r"method\.clip_cov\.ratio must lie in \(0, 1\]"),
        ("kl_cov", "kl_cov.ratio=0", r"method\.kl_cov\.ratio must lie in \(0, 1\]"),
        ("opefo", "entropy_flow.estimator=exact", r"method\.entropy_flow\.estimator is 'exact'"),
        ("opefo", "entropy_flow.balance=none", r"method\.entropy_flow\.balance is 'none'"),
        ("grpo", "entropy_flow.balance=adaptive", r"unknown key method\.entropy_flow\.balance"),
        ("grpo_strict", "clip_eps_low=0.1", r"unknown key method\.clip_eps_low"),
        ("grpo", "clip_ratio_c=1.0", r"method\.clip_ratio_c must be > 1"),
        ("kl_cov", "clip_ratio_c=3.0", r"unknown key method\.clip_ratio_c"),  # no ratio clip
        ("opefo", "entropy_flow.target_entropy=high", r"method\.entropy_flow\.target_entropy"),
        ("opefo", "entropy_flow.target_gain=0", r"method\.entropy_flow\.target_gain must be > 0"),
        ("entropy_reg", "entropy_coef_target=-1", r"method\.entropy_coef_target must be null"),
        (
            "entropy_reg",
            "entropy_coef_target=initial entropy_coef=0.5",
            r"method\.entropy_coef \(0\.5\) must lie in \[entropy_coef_min",
        ),
        ("opefo", "updates_per_rollout=8", r"method\.updates_per_rollout .* strict on-policy"),
        ("grpo", "lr=abc", r"method\.lr must be a number"),
        ("entropy_reg", "entropy_coef=0", r"method\.entropy_coef is 0"),
        (
            "entropy_neutral",
            "entropy_flow.balance=static",
            r"method\.entropy_flow\.balance is 'static'",
        ),
        (
            "entropy_neutral",
            "entropy_flow.target_rate=1.5",
            r"method\.entropy_flow\.target_rate must lie in \(0, 1\]",
        ),
        ("entropy_neutral", "entropy_flow.static_lambda=0.1", r"unknown key .*static_lambda"),
        ("entropy_neutral", "updates_per_rollout=8", r"method\.updates_per_rollout .* strict"),
    ],
)
def test_bad_keys_and_values_fail_naming_the_key(name, override, message):
    with pytest.raises(ValueError, match=message):
        load_method(name, override.split())


def test_unknown_method_and_kl_cov_strict_warning():
    with pytest.raises(ValueError, match="unknown method 'opefoo'"):
        load_method("opefoo")
    with pytest.warns(UserWarning, match="identically zero"):
        load_method("kl_cov", ["updates_per_rollout=1"])
