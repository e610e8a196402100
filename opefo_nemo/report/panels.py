"""The report's panels (the paper's figures, spec §6 keys) and which runs each one can show
(docs/training.md, "Comparing methods and seeds").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opefo_nemo.core.objectives import objective_class
from opefo_nemo.report.derived import LARGEST_PASS
from opefo_nemo.report.runs import Run


@dataclass(frozen=True)
class Panel:
    """One subplot: ``keys`` drawn with ``STYLES`` in order, ``key_names`` saying which is which;
    ``needs``: the logged keys of a measurement a run may leave off (validation, the realized
    change), which a run lacking is named for only when another run logged them (default:
    ``keys``, named for whenever a run lacks them); ``smoothed``: whether the report's moving
    average applies."""

    title: str
    keys: tuple[str, ...]
    ylabel: str
    key_names: tuple[str, ...] = ()
    zero_line: bool = False
    clipped_only: bool = False
    needs: tuple[str, ...] = ()
    smoothed: bool = True

    @property
    def logged_keys(self) -> tuple[str, ...]:
        return self.needs or self.keys


STYLES = ("-", "--", ":")
#: Flow sums are over one optimizer step's batch (spec §3): for a method with k updates per rollout,
#: the mean over its k mini-batch steps of sums over a k-th of the rollout batch (docs/training.md).
FLOW = "Σ ΔH per optimizer step"
PANELS = (
    Panel("token-mean entropy H", ("entropy/mean",), "H (nats)"),
    Panel("training reward (mean over responses)", ("reward/mean",), "reward"),
    Panel("response length", ("response/length_mean",), "tokens"),
    Panel("λ* = (N − P) / (N + P)", ("flow/lambda",), "λ*", zero_line=True),
    Panel("net entropy flow P − N per step", ("flow/net",), FLOW, zero_line=True),
    Panel(
        "entropy flows P and N",
        ("flow/pos", "flow/neg"),
        FLOW,
        key_names=("P (ΔH > 0)", "N (|ΔH|, ΔH < 0)"),
    ),
    Panel(
        "net flow after balancing (1+λ)P − (1−λ)N",
        ("flow/net_after_balance",),
        FLOW,
        zero_line=True,
    ),
    Panel(
        "ΔH of clipped tokens (ratio-clipped methods)",
        ("clip/dh_upper", "clip/dh_lower"),
        FLOW,
        key_names=("upper-clipped", "lower-clipped"),
        zero_line=True,
        clipped_only=True,
    ),
    Panel(
        "P by the sign of the advantage",
        ("flow/pos_adv_pos", "flow/pos_adv_neg"),
        FLOW,
        key_names=("A > 0", "A < 0"),
    ),
    Panel(
        "N by the sign of the advantage",
        ("flow/neg_adv_pos", "flow/neg_adv_neg"),
        FLOW,
        key_names=("A > 0", "A < 0"),
    ),
    Panel(
        "advantage shift Σ(w − 1)A / Σ|A|",
        ("flow/adv_shift", "flow/adv_shift_confident"),
        "shift",
        key_names=("all tokens", "confident tokens"),
        zero_line=True,
    ),
    Panel(
        "confident tokens (π(y) > metrics.confident_prob)",
        ("flow/confident_tokens", "flow/confident_abs_dh"),
        "share",
        key_names=("of the tokens", "of Σ|ΔH|"),
    ),
    Panel(
        "held-out pass@k (validation; step 0: warm start)",
        ("val/pass@1", LARGEST_PASS),
        "pass@k",
        key_names=("pass@1", "pass@k, largest k logged"),
        needs=("val/pass@1",),
        smoothed=False,
    ),
    Panel(
        "sampled entropy change: on the batch and off it",
        ("cumulative/entropy_change", "cumulative/realized", "cumulative/drift"),
        "cumulative ΔH (nats)",
        key_names=("Σ ΔH sampled", "Σ flow/realized", "Σ flow/drift"),
        zero_line=True,
        needs=("flow/realized", "flow/drift"),
        smoothed=False,
    ),
)


def ratio_clipped(method: str | None) -> bool | None:
    """Whether ``method``'s loss clips the ratio (its objective reports the clipped tokens' ΔH,
    spec §5, §6; the others log no ``clip/*`` key); ``None`` when the method is not known here."""
    if method is None:
        return None
    try:
        return "dh_upper" in objective_class(method).loss_sum_names
    except ValueError:
        return None


def shown_runs(panel: Panel, runs: Sequence[Run]) -> list[Run]:
    """The runs ``panel`` is meant to show (for the clipped panel: the ratio-clipped ones, and a
    run of a method this package does not know if it logged the keys)."""
    if not panel.clipped_only:
        return list(runs)
    shown = []
    for run in runs:
        clipped = ratio_clipped(run.method)
        if clipped or (clipped is None and run.has(panel.logged_keys[0])):
            shown.append(run)
    return shown


def missing_metrics(runs: Sequence[Run]) -> dict[Run, list[str]]:
    """For each run that lacks some: the panel keys it was meant to show but never logged (an
    optional measurement, :attr:`Panel.needs`, only where another run made it)."""
    missing: dict[Run, list[str]] = {}
    for panel in PANELS:
        shown = shown_runs(panel, runs)
        if panel.needs and not any(run.has(key) for run in shown for key in panel.needs):
            continue  # a measurement none of these runs made: nothing is missing
        for run in shown:
            absent = [key for key in panel.logged_keys if not run.has(key)]
            if absent:
                missing.setdefault(run, []).extend(absent)
    return missing
