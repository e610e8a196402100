"""Which generated groups a rollout step trains on. Without dynamic sampling: the one round's, all
of them. With it (DAPO's, spec §4): rounds of ``trainer.prompts_per_step`` prompts, all generated
with the same weights, until the step holds that many groups whose rewards differ or
``trainer.dynamic_sampling_max_rounds`` rounds have run (docs/training.md, "Dynamic sampling").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from opefo_nemo.config.run import TrainerConfig
from opefo_nemo.core.advantages import group_signal
from opefo_nemo.rewards import RewardResult
from opefo_nemo.rollout import Completion

Group = tuple[int, int]
"""A generated group: ``(round, prompt index within the round)``."""


@dataclass(frozen=True)
class ScoredRound:
    """One generation round: its ``prompts`` (token ids, one per group), ``completions`` (K per
    prompt, prompt-major, ``prompt_index`` into ``prompts``) with the verifier's ``results``,
    the ``penalties`` (overlong shaping) and the ``rewards`` ``[n]`` (score + penalty), and the
    seconds the generation took."""

    prompts: list[list[int]]
    completions: list[Completion]
    results: list[RewardResult]
    penalties: list[float]
    rewards: Tensor
    generate_s: float

    def signal(self) -> Tensor:
        """``[prompts]`` bool: whether each group's rewards differ."""
        ids = torch.tensor([c.prompt_index for c in self.completions], dtype=torch.long)
        has = torch.zeros(len(self.prompts), dtype=torch.bool)
        has[torch.unique(ids)] = group_signal(self.rewards, ids)
        return has


@dataclass(frozen=True)
class Responses:
    """The responses of some groups, one row each, group by group: per row its prompt,
    completion, verifier result, overlong penalty, reward and group (``0, 1, ...`` in order)."""

    prompts: list[list[int]]
    completions: list[Completion]
    results: list[RewardResult]
    penalties: list[float]
    rewards: Tensor
    group_ids: Tensor

    @property
    def rows(self) -> int:
        return len(self.completions)


def responses_of(rounds: Sequence[ScoredRound], groups: Sequence[Group]) -> Responses:
    """The rows of ``groups``, in their order; group ``g`` of the result is ``groups[g]``."""
    by_prompt = []
    for scored in rounds:
        rows: list[list[int]] = [[] for _ in scored.prompts]
        for i, completion in enumerate(scored.completions):
            rows[completion.prompt_index].append(i)
        by_prompt.append(rows)
    picked = [(g, r, i) for g, (r, p) in enumerate(groups) for i in by_prompt[r][p]]
    return Responses(
        prompts=[rounds[r].prompts[rounds[r].completions[i].prompt_index] for _, r, i in picked],
        completions=[rounds[r].completions[i] for _, r, i in picked],
        results=[rounds[r].results[i] for _, r, i in picked],
        penalties=[rounds[r].penalties[i] for _, r, i in picked],
        rewards=torch.tensor([float(rounds[r].rewards[i]) for _, r, i in picked]),
        group_ids=torch.tensor([g for g, _, _ in picked], dtype=torch.long),
    )


def select_groups(signals: Sequence[Tensor], limit: int, multiple: int) -> tuple[list[Group], int]:
    """The groups to train on, from each round's ``[prompts]`` signal mask: those with signal in
    the order they were generated (round, then prompt), the first ``limit`` of them, cut down to
    a multiple of ``multiple``; and how many groups with signal that leaves out."""
    candidates = [
        (r, p) for r, signal in enumerate(signals) for p in signal.nonzero().flatten().tolist()
    ]
    kept = candidates[:limit]
    kept = kept[: len(kept) - len(kept) % multiple]
    return kept, len(candidates) - len(kept)


@dataclass(frozen=True)
class StepSample:
    """A step's ``rounds``, the groups ``kept`` for the update and, with dynamic sampling,
    ``surplus``: groups with signal left out (beyond ``trainer.prompts_per_step``, or to cut the
    batch into ``method.updates_per_rollout`` equal mini-batches)."""

    rounds: list[ScoredRound]
    kept: list[Group]
    surplus: int
    dynamic: bool

    def generated(self) -> Responses:
        """Every response generated in the step, every round's."""
        every = [(r, p) for r, scored in enumerate(self.rounds) for p in range(len(scored.prompts))]
        return responses_of(self.rounds, every)

    def training(self) -> Responses:
        """The responses of the kept groups: the update's batch."""
        return responses_of(self.rounds, self.kept)

    def metrics(self) -> dict[str, float]:
        """``sampling/rounds``, ``sampling/groups_kept``, ``sampling/groups_dropped`` (rewards
        all equal) and ``sampling/groups_surplus``; empty without dynamic sampling."""
        if not self.dynamic:
            return {}
        generated = sum(len(r.prompts) for r in self.rounds)
        dropped = generated - len(self.kept) - self.surplus
        return {
            "sampling/rounds": float(len(self.rounds)),
            "sampling/groups_kept": float(len(self.kept)),
            "sampling/groups_dropped": float(dropped),
            "sampling/groups_surplus": float(self.surplus),
        }


def sample_step(
    generate: Callable[[int], ScoredRound], settings: TrainerConfig, updates_per_rollout: int
) -> StepSample:
    """Generate round ``0`` (``generate(round)``) and, with ``settings.dynamic_sampling``, more
    rounds until ``prompts_per_step`` groups have signal or ``dynamic_sampling_max_rounds`` ran;
    keep the first ``prompts_per_step`` groups with signal, as many as split into
    ``updates_per_rollout`` equal mini-batches of ``responses_per_prompt`` responses a group.
    Every rank calls it with the same rounds (scores are rank 0's) and keeps the same groups."""
    first = generate(0)
    if not settings.dynamic_sampling:
        return StepSample([first], [(0, p) for p in range(len(first.prompts))], 0, False)
    rounds, signals = [first], [first.signal()]
    wanted = settings.prompts_per_step
    while len(rounds) < settings.dynamic_sampling_max_rounds and (
        sum(int(s.sum()) for s in signals) < wanted
    ):
        rounds.append(generate(len(rounds)))
        signals.append(rounds[-1].signal())
    k = settings.responses_per_prompt
    multiple = updates_per_rollout // math.gcd(updates_per_rollout, k)
    kept, surplus = select_groups(signals, wanted, multiple)
    return StepSample(rounds, kept, surplus, True)
