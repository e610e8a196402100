"""A held-out set calibrated on the model itself (spec §12): the problems of a pool whose count of
correct samples in a calibration draw falls in a stated band, written in our JSONL schema with
that count beside each problem (docs/boundary.md).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opefo_nemo.data.problem import Problem
from opefo_nemo.eval.counts import ProblemCount

#: The field of a held-out row that holds its calibration: ``{"correct": c, "samples": n}``.
CALIBRATION_FIELD = "calibration"


@dataclass(frozen=True)
class Band:
    """Problems with ``low ≤ c ≤ high`` correct samples of the calibration draw's n."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str, samples: int) -> Band:
        """``"LOW-HIGH"`` (counts, both included; ``"8"`` is 8-8), checked against the ``samples``
        drawn per problem: 0 ≤ LOW ≤ HIGH ≤ samples."""
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
        if match is None:
            raise ValueError(f"--band {text!r}: expected LOW-HIGH, counts of correct samples")
        low = int(match.group(1))
        high = low if match.group(2) is None else int(match.group(2))
        if not 0 <= low <= high <= samples:
            raise ValueError(
                f"--band {text}: need 0 <= LOW <= HIGH <= --samples ({samples}), got {low}-{high}"
            )
        return cls(low, high)

    def holds(self, correct: int) -> bool:
        """Whether a problem with ``correct`` correct samples is in the band."""
        return self.low <= correct <= self.high

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"


def select(counts: Sequence[ProblemCount], band: Band) -> list[ProblemCount]:
    """The counts in ``band``, in pool order; none is an error naming ``--band`` and saying where
    the pool's counts lie."""
    chosen = [count for count in counts if band.holds(count.correct)]
    if not chosen:
        raise ValueError(
            f"--band {band} selects none of the {len(counts)} problems (correct samples of "
            f"{counts[0].samples if counts else 0}: {count_histogram(counts)}); the counts are "
            "kept: run again with another --band and nothing is drawn again"
        )
    return chosen


def count_histogram(counts: Sequence[ProblemCount]) -> str:
    """``"c: problems"`` for every count that occurs, in increasing c (``"0: 15, 3: 2"``)."""
    histogram = Counter(count.correct for count in counts)
    return ", ".join(f"{c}: {histogram[c]}" for c in sorted(histogram))


def heldout_row(problem: Problem, count: ProblemCount) -> dict:
    """One line of the held-out file: our JSONL schema (``id``, ``problem``, ``answer``,
    ``source``, and ``messages`` when the pool stored chat messages) and the calibration."""
    row: dict = {
        "id": problem.prompt_id,
        "problem": problem.problem,
        "answer": problem.ground_truth,
        "source": problem.source,
    }
    if problem.messages:
        row["messages"] = [dict(message) for message in problem.messages]
    row[CALIBRATION_FIELD] = {"correct": count.correct, "samples": count.samples}
    return row


def write_heldout(path: Path, problems: Sequence[Problem], chosen: Sequence[ProblemCount]) -> int:
    """Write the ``chosen`` problems (``problems[count.index]``) to ``path``; their number."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for count in chosen:
            problem = problems[count.index]
            if problem.prompt_id != count.prompt_id:
                raise ValueError(f"count of {count.prompt_id} is not problem {count.index}")
            out.write(json.dumps(heldout_row(problem, count), ensure_ascii=False) + "\n")
    return len(chosen)


def read_calibration(path: Path) -> dict[str, tuple[int, int]]:
    """``id → (correct, samples)`` of every row of a held-out file that carries a calibration
    (none for a file that was not calibrated)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        calibration = row.get(CALIBRATION_FIELD) if isinstance(row, dict) else None
        if isinstance(calibration, dict) and "id" in row:
            found[str(row["id"])] = (int(calibration["correct"]), int(calibration["samples"]))
    return found
