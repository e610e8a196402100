"""core/ has no Python loop over tokens: every `for` in it iterates over a known small collection.

A new loop must be added to ALLOWED with the reason it is not per token, or be vectorised.
"""

from __future__ import annotations

import ast
from pathlib import Path

import opefo_nemo.core

CORE = Path(opefo_nemo.core.__file__).parent
ALLOWED = {
    # (file, function): what its loops iterate over
    ("entropy_flow.py", "delta_entropy"): "three named input tensors",
    ("tensor_checks.py", "check_same_shape"): "named tensors",
    ("tensor_checks.py", "_nonfinite_error"): "the dimensions of one index",
    ("deferred_checks.py", "first_error"): "the checks of one pass (a few per micro-batch)",
    ("reduction.py", "sum"): "named sums",
    ("metrics.py", "add_sums"): "named sums",
    ("objectives/tokens.py", "__post_init__"): "field names",
    ("objectives/prepare.py", "prepare"): "chunks",
    ("objectives/prepare.py", "_applied_sums"): "chunks",
    ("objectives/base.py", "coefficients"): "chunks",
    ("objectives/methods/balanced_policy_gradient.py", "coefficients"): "chunks",
    ("objectives/methods/grpo_strict.py", "corrected"): "chunks",
    ("objectives/methods/advantage_sign.py", "coefficients"): "chunks",
    ("metrics.py", "load_state_dict"): "the fields of a running correlation",
    ("objectives/methods/clip_cov.py", "coefficients"): "chunks",
    ("objectives/methods/kl_cov.py", "coefficients"): "chunks",
    ("objectives/methods/covariance.py", "selection_coefficients"): "chunks",
    ("objectives/methods/covariance.py", "select_top_k"): "chunks",
    ("objectives/methods/covariance.py", "token_uniform"): "four hash rounds",
    ("objectives/methods/steer.py", "coefficients"): "chunks",
    ("objectives/methods/steer.py", "_global_range"): "chunks",
    ("schema.py", "build"): "config keys",
    ("schema.py", "_value"): "the types of a union, the items of a config list",
    ("update_correction.py", "dot64"): "slices of 4 Mi elements, bounding float64 temporaries",
}


def _loops():
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.For | ast.comprehension):
                    yield str(path.relative_to(CORE)), func.name


def test_every_loop_in_core_is_over_a_small_known_collection():
    unexpected = sorted({loop for loop in _loops() if loop not in ALLOWED})
    assert not unexpected, (
        f"loops in core/ in functions not known to loop over chunks or names: {unexpected}"
    )
