"""The report's panels (the paper's figures, spec §6 keys) and which runs each one can show.

The clipped-token panel (``clip/dh_upper``, ``clip/dh_lower``) shows only methods whose loss clips
the ratio (their objective reports the clipped tokens' ΔH, spec §5, §6): the others log no
``clip/*`` key. A run of a method this package does not know is shown if it logged them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.objectives import objective_class
from .runs import Run


@dataclass(frozen=True)
class Panel:
    """One subplot: ``keys`` drawn with ``STYLES`` in order, ``key_names`` saying which is which."""

    title: str
    keys: tuple[str, ...]
    ylabel: str
    key_names: tuple[str, ...] = ()
    zero_line: bool = False
    clipped_only: bool = False


STYLES = ("-", "--")
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
)


def ratio_clipped(method: str | None) -> bool | None:
    """Whether ``method``'s loss clips the ratio; ``None`` when the method is not known here."""
    if method is None:
        return None
    try:
        return "dh_upper" in objective_class(method).loss_sum_names
    except ValueError:
        return None


def shown_runs(panel: Panel, runs: Sequence[Run]) -> list[Run]:
    """The runs ``panel`` is meant to show (for the clipped panel: the ratio-clipped ones)."""
    if not panel.clipped_only:
        return list(runs)
    shown = []
    for run in runs:
        clipped = ratio_clipped(run.method)
        if clipped or (clipped is None and run.has(panel.keys[0])):
            shown.append(run)
    return shown


def missing_metrics(runs: Sequence[Run]) -> dict[Run, list[str]]:
    """For each run that lacks some: the panel keys it was meant to show but never logged."""
    missing: dict[Run, list[str]] = {}
    for panel in PANELS:
        for run in shown_runs(panel, runs):
            absent = [key for key in panel.keys if not run.has(key)]
            if absent:
                missing.setdefault(run, []).extend(absent)
    return missing
