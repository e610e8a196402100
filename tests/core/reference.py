"""Brute-force references for the core tests: plain Python loops over tokens, no vectorisation.

These are deliberately written from docs/spec.md alone, independently of opefo_nemo.core.
"""

from __future__ import annotations

import math


def delta_h_paper(lp: float, h: float, a: float) -> float:
    p = math.exp(lp)
    return -a * (1 - p) ** 2 * (lp + h)


def delta_h_tabular(lp: float, h: float, a: float, s2: float, s2l: float) -> float:
    p = math.exp(lp)
    return -a * (p * (lp + h) - (s2l + h * s2))


def delta_h_expectation(logits: list[float], a: float) -> float:
    """``−A Σ_a π(a)(1 − π(a))² (log π(a) + H)`` of ``softmax(logits)``, term by term."""
    m = max(logits)
    z = sum(math.exp(x - m) for x in logits)
    log_probs = [x - m - math.log(z) for x in logits]
    h = -sum(math.exp(lp) * lp for lp in log_probs)
    return -a * sum(math.exp(lp) * (1 - math.exp(lp)) ** 2 * (lp + h) for lp in log_probs)


def flow(delta_h: list[float], mask: list[bool]) -> tuple[float, float]:
    pos = neg = 0.0
    for d, m in zip(delta_h, mask, strict=True):
        if m and d > 0:
            pos += d
        elif m and d < 0:
            neg += -d
    return pos, neg


def lam_star(pos: float, neg: float) -> float:
    return (neg - pos) / max(neg + pos, 1e-12)


def weights(delta_h, mask, pos, neg, balance, static_lambda=0.001, shift=0.0) -> list[float]:
    lam = static_lambda if balance == "static" else lam_star(pos, neg)
    if balance == "target":
        lam = min(max(lam + shift, -1.0), 1.0)
    up = 1 + lam if balance in ("adaptive", "target", "static", "pos_only") else 1.0
    down = 1 - lam if balance in ("adaptive", "target", "static", "neg_only") else 1.0
    out = []
    for d, m in zip(delta_h, mask, strict=True):
        out.append(up if (m and d > 0) else down if (m and d < 0) else 1.0)
    return out


def advantages(rewards, groups, normalize_std=True, leave_one_out=False) -> list[float]:
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == g]
        n = len(members)
        if n < 2:
            out.append(0.0)
            continue
        mean = sum(members) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (n - 1))
        if leave_one_out:
            others = [rewards[j] for j in range(len(rewards)) if groups[j] == g and j != i]
            centered = r - sum(others) / len(others)
        else:
            centered = r - mean
        out.append(centered / (std + 1e-6) if normalize_std else centered)
    return out


def entropy(logits: list[float]) -> float:
    m = max(logits)
    z = sum(math.exp(x - m) for x in logits)
    probs = [math.exp(x - m) / z for x in logits]
    return -sum(p * math.log(p) for p in probs if p > 0)
