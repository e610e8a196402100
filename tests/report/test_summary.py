"""summary.md: each group's figures against statistics computed here; missing metrics named."""

from __future__ import annotations

import math
import statistics

import pytest

from opefo_nemo.report import write_report

from .run_dirs import PANEL_KEYS, records, run_config, write_run

STEPS = range(1, 26)


def value(seed: int):
    """Distinct, seed-dependent series: entropy falls linearly, λ* alternates in sign."""

    def at(key: str, step: int) -> float:
        if key == "entropy/mean":
            return 1.0 - 0.01 * step + 0.05 * seed
        if key == "flow/lambda" and step > 20:  # a larger λ* after step 20: early ≠ whole run
            return (0.7 + 0.1 * seed) * (-1) ** step
        if key == "flow/lambda":
            return (0.2 + 0.1 * seed) * (-1) ** step
        if key.startswith("flow/adv_shift"):
            return -(0.1 + 0.2 * seed) * (1 + len(key) % 3) + 0.01 * step
        if key == "reward/mean":
            return 0.1 * (step % 3) + 0.02 * seed + 0.004 * step * (1 + seed)
        return 0.25 * seed + 0.001 * step

    return at


def cells(table: str, label: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def parse(cell: str) -> tuple[float, float | None]:
    mean, _, std = cell.partition(" ± ")
    return float(mean), (float(std) if std else None)


def test_group_rows_are_mean_and_sample_std_over_seeds(tmp_path):
    dirs = []
    for seed in (0, 1):
        path = tmp_path / f"s{seed}"
        write_run(path, records(STEPS, value(seed)), run_config("grpo_strict", seed, path))
        dirs.append(path)
    table = write_report(dirs, tmp_path / "out", window=10).summary.read_text()
    header = cells(table, "group")
    row = dict(zip(header, cells(table, "grpo_strict"), strict=True))
    assert row["seeds"] == "0, 1" and row["steps"] == "25"

    def per_seed(key, pick):
        return [pick([value(s)(key, t) for t in STEPS]) for s in (0, 1)]

    expected = {
        "H first": per_seed("entropy/mean", lambda v: statistics.fmean(v[:10])),
        "H last": per_seed("entropy/mean", lambda v: statistics.fmean(v[-10:])),
        "reward last": per_seed("reward/mean", lambda v: statistics.fmean(v[-10:])),
        "mean abs λ*": per_seed("flow/lambda", lambda v: statistics.fmean(map(abs, v))),
        "abs λ* steps 1–20": per_seed("flow/lambda", lambda v: statistics.fmean(map(abs, v[:20]))),
        "reward rise": per_seed(
            "reward/mean", lambda v: statistics.fmean(v[-10:]) - statistics.fmean(v[:10])
        ),
        "adv shift": per_seed("flow/adv_shift", statistics.fmean),
        "confident shift": per_seed("flow/adv_shift_confident", statistics.fmean),
        "mean realized": per_seed("flow/realized", statistics.fmean),
        # every step logged both: step s's drift closes step s − 1's realized change
        "Σ realized": per_seed("flow/realized", lambda v: sum(v[:-1])),
        "Σ drift": per_seed("flow/drift", lambda v: sum(v[1:])),
        "pass@1 first": per_seed("val/pass@1", lambda v: v[0]),
        "pass@1 last": per_seed("val/pass@1", lambda v: v[-1]),
        "pass@k first": per_seed("val/pass@4", lambda v: v[0]),
        "pass@k last": per_seed("val/pass@4", lambda v: v[-1]),
        "H change %": [
            100 * (statistics.fmean(v[-10:]) - statistics.fmean(v[:10])) / statistics.fmean(v[:10])
            for v in ([value(s)("entropy/mean", t) for t in STEPS] for s in (0, 1))
        ],
    }
    for column, figures in expected.items():
        mean, std = parse(row[column])
        mean_figure = statistics.fmean(figures)
        if column in ("mean realized", "Σ realized", "Σ drift"):  # three significant digits
            bound = 0.51 * 10 ** (math.floor(math.log10(abs(mean_figure))) - 2)
        else:
            bound = 0.51 * 10 ** -(1 if column == "H change %" else 3)
        assert mean == pytest.approx(mean_figure, abs=bound), column
        assert std == pytest.approx(statistics.stdev(figures), rel=0.051), column  # 2 digits


def test_runs_missing_a_metric_are_named_and_left_out(tmp_path):
    """opefo seed 1 never logged λ*: the group's λ* is seed 0's alone, and summary.md names the
    run. A strict method's clip/* keys are not expected (it clips nothing); a clipped method's
    are."""
    keys_without = {
        "opefo0": PANEL_KEYS,
        "opefo1": [k for k in PANEL_KEYS if k != "flow/lambda"],
        "strict": [k for k in PANEL_KEYS if not k.startswith("clip/")],
        "clipped": [k for k in PANEL_KEYS if k != "clip/dh_lower"],
    }
    methods = {"opefo0": "opefo", "opefo1": "opefo", "strict": "grpo_strict", "clipped": "grpo"}
    dirs = []
    for name, keys in keys_without.items():
        seed = int(name == "opefo1")
        path = write_run(
            tmp_path / name,
            records(STEPS, value(seed), keys),
            run_config(methods[name], seed, tmp_path / name),
        )
        dirs.append(path)
    table = write_report(dirs, tmp_path / "out").summary.read_text()
    header = cells(table, "group")
    opefo = dict(zip(header, cells(table, "opefo"), strict=True))
    lam_seed0 = statistics.fmean(abs(value(0)("flow/lambda", t)) for t in STEPS)
    assert parse(opefo["mean abs λ*"]) == (pytest.approx(lam_seed0, abs=5.1e-4), None)
    missing = table.split("## Missing metrics")[1].strip().splitlines()
    assert missing == [
        f"- {tmp_path / 'opefo1'} (opefo seed 1): no `flow/lambda`; left out of those panels",
        f"- {tmp_path / 'clipped'} (grpo seed 0): no `clip/dh_lower`; left out of those panels",
    ]


def test_a_complete_set_of_runs_reports_nothing_missing(tmp_path):
    path = write_run(tmp_path / "r", records(STEPS, value(0)), run_config("opefo", 0, tmp_path))
    table = write_report([path], tmp_path / "out").summary.read_text()
    assert "Every run logged every metric its panels show." in table
    row = cells(table, "opefo")
    assert "±" not in "".join(row)  # one run: plain values
    first = statistics.fmean(1.0 - 0.01 * t for t in range(1, 11))
    assert parse(row[3]) == (pytest.approx(first, abs=5.1e-4), None)
