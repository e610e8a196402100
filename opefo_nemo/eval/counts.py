"""Per-problem sample counts and the file that keeps them as they are drawn, one line per finished
problem after a header of the settings, so an interrupted run loses only the problems in flight
and the same command again draws only the rest (docs/boundary.md, "Cost").
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProblemCount:
    """What ``samples`` samples of problem ``index`` (of the pool or held-out file; id
    ``prompt_id``) came to: ``correct`` of them scored correct, ``answers`` counts each distinct
    final answer the verifier extracted (``no_answer`` samples had none), ``truncated`` hit the
    length limit, ``tokens`` were generated in all."""

    index: int
    prompt_id: str
    samples: int
    correct: int
    answers: dict[str, int] = field(default_factory=dict)
    no_answer: int = 0
    truncated: int = 0
    tokens: int = 0

    @property
    def distinct_answers(self) -> int:
        """The number of different final answers among the samples."""
        return len(self.answers)

    @classmethod
    def from_samples(
        cls,
        index: int,
        prompt_id: str,
        correct: Sequence[bool],
        answers: Sequence[str | None],
        truncated: int,
        tokens: int,
    ) -> ProblemCount:
        """The count of one problem from its samples' verdicts and extracted answers."""
        seen = Counter(answer for answer in answers if answer is not None)
        return cls(
            index=index,
            prompt_id=prompt_id,
            samples=len(correct),
            correct=sum(bool(c) for c in correct),
            answers=dict(seen.most_common()),
            no_answer=sum(answer is None for answer in answers),
            truncated=truncated,
            tokens=tokens,
        )

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> ProblemCount:
        """The count a line of a counts file holds."""
        return cls(**{key: row[key] for key in cls.__dataclass_fields__ if key in row})


class CountsMismatchError(ValueError):
    """A counts file was drawn with other settings or over other problems than asked for."""


class CountsFile:
    """The counts file at ``path`` for ``settings``: the counts already there (:attr:`done`) when
    its header names the same settings, a new file otherwise; :meth:`append` adds one finished
    problem and flushes it. The file is JSON lines: a header ``{"counts": SETTINGS}`` naming
    everything the samples depend on (model, sampling, seed, verifier, generator), then one
    :class:`ProblemCount` a line."""

    def __init__(self, path: Path, settings: Mapping[str, Any], prompt_ids: Sequence[str]):
        self.path = path
        self.settings = dict(settings)
        self.done: dict[int, ProblemCount] = {}
        if path.is_file() and path.stat().st_size:
            self._resume(prompt_ids)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"counts": self.settings}) + "\n", encoding="utf-8")

    def _resume(self, prompt_ids: Sequence[str]) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        stored = json.loads(lines[0]).get("counts")
        if stored != self.settings:
            differ = sorted(
                key
                for key in set(self.settings) | set(stored or {})
                if (stored or {}).get(key) != self.settings.get(key)
            )
            raise CountsMismatchError(
                f"{self.path} was drawn with other settings ({', '.join(differ)} differ): "
                "pass another --out, or delete it to draw again"
            )
        for line in lines[1:]:
            if not line.strip():
                continue
            try:
                count = ProblemCount.from_json(json.loads(line))
            except (json.JSONDecodeError, TypeError, KeyError):
                continue  # a line cut by an interruption: that problem is drawn again
            if count.index >= len(prompt_ids) or prompt_ids[count.index] != count.prompt_id:
                raise CountsMismatchError(
                    f"{self.path} holds problem {count.index} as {count.prompt_id}, which is not "
                    "that problem of this file: pass another --out, or delete it to draw again"
                )
            self.done[count.index] = count
        kept = [json.dumps({"counts": self.settings})]  # the file again without a cut line
        kept += [json.dumps(asdict(self.done[i])) for i in sorted(self.done)]
        partial = self.path.with_suffix(".partial")
        partial.write_text("\n".join(kept) + "\n", encoding="utf-8")
        partial.replace(self.path)

    def append(self, counts: Iterable[ProblemCount]) -> None:
        """Record finished problems (one line each, flushed before returning)."""
        with self.path.open("a", encoding="utf-8") as handle:
            for count in counts:
                handle.write(json.dumps(asdict(count)) + "\n")
                self.done[count.index] = count

    def ordered(self, problems: int) -> list[ProblemCount]:
        """The counts of problems ``0 .. problems − 1`` in order (all must be done)."""
        missing = [i for i in range(problems) if i not in self.done]
        if missing:
            raise ValueError(f"{self.path}: problems {missing[:10]} have no counts yet")
        return [self.done[i] for i in range(problems)]


def read_counts(path: Path) -> tuple[dict[str, Any], list[ProblemCount]]:
    """The settings and the counts (in problem order) of a counts file."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    settings = json.loads(lines[0])["counts"]
    counts = {c.index: c for c in (ProblemCount.from_json(json.loads(x)) for x in lines[1:])}
    return settings, [counts[i] for i in sorted(counts)]
