"""Run directories written as the trainer writes them, with metrics chosen by the test."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from opefo_nemo.config.compose import compose

#: Every key a panel shows or is computed from (docs/spec.md §6, §7).
PANEL_KEYS = (
    "entropy/mean",
    "reward/mean",
    "response/length_mean",
    "flow/lambda",
    "flow/net",
    "flow/pos",
    "flow/neg",
    "flow/net_after_balance",
    "clip/dh_upper",
    "clip/dh_lower",
    "flow/pos_adv_pos",
    "flow/pos_adv_neg",
    "flow/neg_adv_pos",
    "flow/neg_adv_neg",
    "flow/adv_shift",
    "flow/adv_shift_confident",
    "flow/confident_tokens",
    "flow/confident_abs_dh",
    "val/pass@1",
    "val/pass@4",
    "flow/realized",
    "flow/drift",
)


@functools.cache
def _composed(overrides: tuple[str, ...]) -> dict[str, Any]:
    return compose(list(overrides))[1]


def run_config(method: str, seed: int, output_dir: Path, extra: Sequence[str] = ()) -> dict:
    """The configuration ``opefo-train method=<method> run.seed=<seed> ...`` composes."""
    config = copy.deepcopy(_composed((f"method={method}", *extra)))
    config["run"].update(seed=seed, name=f"{method}_seed{seed}", output_dir=str(output_dir))
    return config


def write_run(
    path: Path,
    records: Iterable[dict[str, Any]],
    config: dict[str, Any] | None,
) -> Path:
    """``path/metrics.jsonl`` (one record a line) and, unless ``None``, ``path/config.yaml``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config is not None:
        (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def records(
    steps: Iterable[int],
    value: Callable[[str, int], float | None],
    keys: Sequence[str] = PANEL_KEYS,
) -> list[dict[str, Any]]:
    """One record per step with ``value(key, step)`` for each key (``None`` is logged as null,
    as the trainer logs a non-finite value)."""
    return [{"step": s, **{k: value(k, s) for k in keys}} for s in steps]
