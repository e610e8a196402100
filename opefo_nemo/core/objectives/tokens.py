"""Per-token tensors that flow through the two phases of a step (docs/architecture.md): phase 1's
:class:`TokenChunk`, ``prepare``'s :class:`Coefficients`, phase 3's :class:`LossInputs`. Every
tensor of one object has the same shape ``[*]`` (e.g. ``[micro_batch, seq]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from opefo_nemo.core.tensor_checks import as_bool_mask, check_finite, check_same_shape


@dataclass(frozen=True)
class TokenChunk:
    """Phase-1 statistics of a chunk of tokens.

    ``logprob``/``entropy``: of the current policy (spec §1), fp32. ``advantages``: per token,
    broadcast from the sequence (spec §4). ``mask``: response tokens. ``old_logprob``: of the
    policy that generated the rollout, for the multi-update baselines; ``None`` in strict mode.
    ``token_ids``: unique global int64 id of each token (e.g. ``sample * max_len + position``),
    needed by the Clip-Cov / KL-Cov selections so they do not depend on the layout.
    ``sum_p2``/``sum_p2_logp``: for the ``tabular`` and ``expectation`` estimators,
    ``sum_p3``/``sum_p3_logp``: for ``expectation`` (spec §2). ``rollout_logprob``: the rollout
    engine's log-probability of each token (for a truncated importance-sampling correction).
    ``old_entropy``: the entropy ``H_t`` under the policy that generated the rollout (what STEER's
    weights read; ``None`` when it is ``entropy``, as in strict mode and the first update).
    """

    logprob: Tensor
    entropy: Tensor
    advantages: Tensor
    mask: Tensor
    old_logprob: Tensor | None = None
    token_ids: Tensor | None = None
    sum_p2: Tensor | None = None
    sum_p2_logp: Tensor | None = None
    sum_p3: Tensor | None = None
    sum_p3_logp: Tensor | None = None
    rollout_logprob: Tensor | None = None
    old_entropy: Tensor | None = None

    def __post_init__(self) -> None:
        check_same_shape(
            "logprob",
            self.logprob,
            entropy=self.entropy,
            advantages=self.advantages,
            mask=self.mask,
            old_logprob=self.old_logprob,
            token_ids=self.token_ids,
            sum_p2=self.sum_p2,
            sum_p2_logp=self.sum_p2_logp,
            sum_p3=self.sum_p3,
            sum_p3_logp=self.sum_p3_logp,
            rollout_logprob=self.rollout_logprob,
            old_entropy=self.old_entropy,
        )
        statistics = (
            "logprob",
            "entropy",
            "advantages",
            "old_logprob",
            "rollout_logprob",
            "old_entropy",
        )
        for name in (*statistics, "sum_p2", "sum_p2_logp", "sum_p3", "sum_p3_logp"):
            check_finite(name, getattr(self, name))
        if self.token_ids is not None and torch.is_floating_point(self.token_ids):
            raise ValueError(f"token_ids must be integers, got dtype {self.token_ids.dtype}")
        object.__setattr__(self, "mask", as_bool_mask(self.mask))


@dataclass(frozen=True)
class Coefficients:
    """Per-token coefficients of one chunk, derived from global sums; no gradient.

    ``delta_h``: ΔH_t (spec §2). ``weight``: w_t (spec §3). ``selected``: tokens chosen by the
    method's batch-level selection (Clip-Cov: gradient removed; KL-Cov: penalised), else all False.
    """

    delta_h: Tensor
    weight: Tensor
    selected: Tensor


@dataclass(frozen=True)
class LossInputs:
    """What a per-token loss ``ℓ_t`` is computed from (phase 3).

    ``logprob``/``entropy`` carry gradient (``entropy`` only when the objective asks for it);
    ``old_logprob`` is detached (``logprob.detach()`` in strict mode, so ``ρ ≡ 1``).
    """

    logprob: Tensor
    old_logprob: Tensor
    advantages: Tensor
    weight: Tensor
    selected: Tensor
    entropy: Tensor | None = None

    @property
    def ratio(self) -> Tensor:
        """``ρ_t = exp(logprob − logprob_old)`` (spec §5), with gradient through ``logprob``."""
        return torch.exp(self.logprob - self.old_logprob)
