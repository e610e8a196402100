"""Verifiable math rewards with per-item time limits: the DAPO rule (`dapo`), the same extraction
with a lenient normalisation (`answer`), and symbolic equivalence (`math_verify`); `score`,
`score_batch`, `RewardPool`, `RewardConfig` (docs/rewards_data_eval.md, "Rewards").
"""

from opefo_nemo.rewards.overlong import overlong_penalty
from opefo_nemo.rewards.pool import RewardPool
from opefo_nemo.rewards.result import REASONS, VERIFIERS, RewardConfig, RewardResult
from opefo_nemo.rewards.scoring import score, score_batch

__all__ = [
    "REASONS",
    "VERIFIERS",
    "RewardConfig",
    "RewardPool",
    "RewardResult",
    "overlong_penalty",
    "score",
    "score_batch",
]
