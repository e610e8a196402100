"""The built-in tasks' verifiers by their ``reward.verifier`` name: the one list of them, which
the configuration validates against and the trainer scores with (docs/rewards_data_eval.md,
"Verifiers")."""

from __future__ import annotations

from opefo_nemo.tasks.arithmetic import score_final_answer
from opefo_nemo.tasks.word_arithmetic import score_last_number

TASK_VERIFIERS = {"arithmetic": score_final_answer, "last_number": score_last_number}
"""Each verifier scores a response against its ground truth by a ``ScoringConfig`` (1 / 0 unless
``reward.incorrect_score`` says otherwise); what each reads: ``reward.verifier``'s docstring."""
