"""One math problem with a verifiable answer, and its stable prompt id."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

Message = dict[str, str]


def prompt_id_for(source: str, problem: str, ground_truth: str) -> str:
    """A stable id for a problem: `<source>-<16 hex digits of sha256(problem, answer)>`.

    It depends only on the text, never on file order, so the K responses sampled for one
    prompt (a GRPO group, spec §4) can be matched exactly across runs and data-parallel ranks.
    """
    digest = hashlib.sha256(f"{problem}\x00{ground_truth}".encode()).hexdigest()[:16]
    return f"{source}-{digest}"


@dataclass(frozen=True)
class Problem:
    """A problem to prompt the policy with.

    prompt_id: stable id (see `prompt_id_for`) unless the file gives one.
    problem: the bare problem statement (no instructions around it).
    ground_truth: the reference final answer, as a string.
    source: the dataset it came from ("dapo_math_17k", "aime24", ...).
    messages: the chat messages stored with the problem (DAPO's parquet has them, already
        wrapped in DAPO's instruction); empty when the file has none.
    """

    prompt_id: str
    problem: str
    ground_truth: str
    source: str
    messages: tuple[Message, ...] = field(default_factory=tuple)
