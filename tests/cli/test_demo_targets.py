"""The demo's figures (cli/demo_targets.py) against the same means computed by a plain loop."""

from __future__ import annotations

import json
import math
import random

import pytest

from opefo_nemo.cli.demo_targets import targets_report, write_targets


def records(
    rng: random.Random,
    steps: int,
    reward: tuple[float, float],
    entropy: tuple[float, float],
    lam: tuple[float, float] = (0.05, 0.3),
):
    out = []
    for step in range(1, steps + 1):
        t = (step - 1) / (steps - 1)
        row = {
            "step": step,
            "reward/mean": reward[0] + t * (reward[1] - reward[0]) + rng.uniform(-0.05, 0.05),
            "entropy/mean": entropy[0] + t * (entropy[1] - entropy[0]),
            "flow/lambda": rng.choice((-1, 1)) * rng.uniform(*lam),
            "flow/adv_shift_confident": rng.uniform(-0.5, 0.1),
            "flow/net": -rng.uniform(0.1, 1.0),
            "flow/net_after_balance": rng.uniform(-1e-9, 1e-9),
        }
        if step % 5 == 0:
            row["flow/realized"] = rng.uniform(-0.01, 0.004)
        out.append(row)
    return out


def loop_figures(rows, predicted):
    reward = [r["reward/mean"] for r in rows]
    entropy = [r["entropy/mean"] for r in rows]
    realized = [r["flow/realized"] for r in rows if "flow/realized" in r]
    first_r = sum(reward[:10]) / 10
    last_r = sum(reward[-10:]) / 10
    first_h, last_h = sum(entropy[:10]) / 10, sum(entropy[-10:]) / 10
    early = [abs(r["flow/lambda"]) for r in rows[:20]]
    shift = [r["flow/adv_shift_confident"] for r in rows]
    return {
        "early": f"{sum(early) / len(early):.2f}",
        "shift": f"{sum(shift) / len(shift):+.2f}",
        "lambda_early": sum(early) / len(early),
        "reward": f"{first_r:.3f} → {last_r:.3f}",
        "entropy": f"{first_h:.3f} → {last_h:.3f}",
        "change": f"{100 * (last_h / first_h - 1):+.0f} %",
        "predicted": f"{sum(r[predicted] for r in rows) / len(rows):+.3g}",
        "realized": f"{sum(realized) / len(realized):+.2e} ({sum(x < 0 for x in realized)} of "
        f"{len(realized)})",
        "rise": last_r - first_r,
        "fall": last_h / first_h - 1,
    }


@pytest.mark.parametrize(
    ("reward", "entropy", "lam", "met"),
    [
        ((0.2, 0.6), (0.15, 0.06), (0.0, 0.3), True),
        ((0.2, 0.3), (0.15, 0.06), (0.0, 0.3), False),
        ((0.2, 0.6), (0.15, 0.1), (0.0, 0.3), False),
        ((0.2, 0.6), (0.15, 0.06), (0.5, 0.9), False),
    ],
)
def test_the_figures_and_the_verdict_match_a_loop(reward, entropy, lam, met, tmp_path):
    rng = random.Random(3)
    runs = {
        "grpo_strict": records(rng, 80, reward, entropy, lam),
        "opefo": records(rng, 80, (0.2, 0.3), (0.15, 0.16)),
    }
    text, verdict = targets_report(runs)
    expected = {
        m: loop_figures(rows, "flow/net" if m == "grpo_strict" else "flow/net_after_balance")
        for m, rows in runs.items()
    }
    for method, f in expected.items():
        line = next(line for line in text.splitlines() if line.startswith(f"| {method} |"))
        for key in ("reward", "entropy", "change", "early", "shift", "predicted", "realized"):
            assert f[key] in line, (key, f[key], line)
    g = expected["grpo_strict"]
    assert verdict == met == (g["rise"] >= 0.20 and g["fall"] <= -0.40 and g["lambda_early"] <= 0.2)
    assert f"reward rise {g['rise']:+.3f}" in text
    assert not math.isnan(g["rise"])
    for method, rows in runs.items():
        (tmp_path / method).mkdir()
        (tmp_path / method / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    assert write_targets(tmp_path, list(runs)) == text == (tmp_path / "targets.md").read_text()
