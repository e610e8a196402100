"""Verifiable math rewards with per-item time limits: the DAPO rule (`dapo`), the same extraction
with a lenient normalisation (`answer`), and symbolic equivalence (`math_verify`); `score`,
`score_batch`, `RewardPool`, `ScoringConfig` (docs/rewards_data_eval.md, "Rewards").
"""

from opefo_nemo.rewards.overlong import overlong_penalty
from opefo_nemo.rewards.pool import RewardPool
from opefo_nemo.rewards.result import REASONS, VERIFIERS, RewardResult, ScoringConfig
from opefo_nemo.rewards.scoring import score, score_batch

__all__ = [
    "REASONS",
    "VERIFIERS",
    "RewardPool",
    "RewardResult",
    "ScoringConfig",
    "overlong_penalty",
    "score",
    "score_batch",
]
