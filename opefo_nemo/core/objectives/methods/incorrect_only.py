"""``incorrect_only`` (spec §5): negative sample reinforcement, strict GRPO's loss on the
responses whose advantage is negative only (:mod:`.advantage_sign`)."""

from __future__ import annotations

from opefo_nemo.core.objectives.methods.advantage_sign import SignedPolicyGradient
from opefo_nemo.core.objectives.registry import register_objective


@register_objective("incorrect_only")
class IncorrectOnly(SignedPolicyGradient):
    """Negative sample reinforcement (Zhu et al. 2025): strict GRPO's ``−A_t log π(y_t)`` on the
    tokens with ``A_t < 0`` (the responses scored below their group's mean: the wrong ones of a
    group with binary rewards), weight 0 elsewhere; divided by all the batch's response tokens,
    as strict GRPO (strict on-policy). Reported to keep pass@k at large k."""

    kept_sign = -1
