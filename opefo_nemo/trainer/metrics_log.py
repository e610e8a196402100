"""Where the spec §6 metrics of every step go: ``metrics.jsonl`` (with ``config.yaml`` beside it),
TensorBoard, W&B, a progress bar (docs/training.md, "Checkpoints, pre-emption, resume", on what a
resumed run does with them); and each update's row lengths, ``lengths.jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import yaml

from opefo_nemo.config.metrics import MetricsConfig

RUN_CONFIG = "config.yaml"
SUPERSEDED = "metrics.superseded.jsonl"
LENGTHS = "lengths.jsonl"
"""Per step, the prompt and response tokens of each row the update trained on
(docs/batch_layout.md, "The lengths of a run")."""
log = logging.getLogger(__name__)

PROGRESS_KEYS = {
    "reward/mean": "reward",
    "entropy/mean": "H",
    "flow/lambda": "λ*",
    "time/step_s": "s/step",
}


class MetricsLogger:
    """Appends to ``<output_dir>/metrics.jsonl`` one object per rollout step,
    ``{"step": s, "<name>": value, ...}`` (with validation, a step-0 object holding the warm
    start's ``val/*``), and writes ``config.yaml`` beside it: the run's composed configuration, so
    that ``opefo-report`` can tell which runs are seeds of the same method without guessing from
    paths. TensorBoard event files go to ``tensorboard/`` (each start writes a new one); W&B
    (``metrics.wandb.enabled``) is imported only when enabled and runs offline by default; the
    progress bar shows reward, entropy, λ* and the step time. A run
    resumed at ``start_step`` continues the same file after moving any record of a later step to
    ``metrics.superseded.jsonl`` (:func:`set_aside_later_steps`), so every step appears in
    ``metrics.jsonl`` exactly once and no record is lost; a run that starts at step 0 moves them
    all (it logs the warm start's step 0 again). :meth:`log_lengths` writes ``lengths.jsonl``
    beside it, set aside alike (``lengths.superseded.jsonl``)."""

    def __init__(
        self,
        output_dir: Path,
        config: MetricsConfig,
        run_name: str,
        total_steps: int,
        start_step: int,
        config_dict: dict[str, Any],
    ):
        output_dir.mkdir(parents=True, exist_ok=True)
        write_run_config(output_dir, config_dict)
        self.path = output_dir / "metrics.jsonl"
        set_aside_later_steps(self.path, start_step if start_step > 0 else -1)
        self._file = self.path.open("a")
        lengths = output_dir / LENGTHS
        set_aside_later_steps(lengths, start_step if start_step > 0 else -1)
        self._lengths = lengths.open("a")
        self._tensorboard = None
        self._wandb = None
        self._bar = None
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(output_dir / "tensorboard"))
        if config.wandb.enabled:
            try:
                import wandb
            except ImportError:
                raise ImportError(
                    "metrics.wandb.enabled=true but wandb is not installed (pip install wandb)"
                ) from None
            self._wandb = wandb.init(
                project=config.wandb.project,
                name=run_name,
                mode=config.wandb.mode,  # type: ignore[arg-type]  # wandb checks its own modes
                dir=str(output_dir),
                config=config_dict,
            )
        if config.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc=run_name, unit="step")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()
        }
        self._file.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name, value in metrics.items():
                self._tensorboard.add_scalar(name, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._bar is not None:
            shown = {
                short: f"{metrics[k]:.3g}" for k, short in PROGRESS_KEYS.items() if k in metrics
            }
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(step - self._bar.n)

    def log_lengths(self, step: int, prompt_tokens: list[int], response_tokens: list[int]) -> None:
        """One line of ``lengths.jsonl``: ``{"step": s, "prompt_tokens": [...],
        "response_tokens": [...]}``, the rows of step ``s``'s update in the batch's order (about
        5 bytes a row: 1.3 KiB a step of 256 rows)."""
        record = {"step": step, "prompt_tokens": prompt_tokens, "response_tokens": response_tokens}
        self._lengths.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._lengths.flush()

    def close(self) -> None:
        self._file.close()
        self._lengths.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._bar is not None:
            self._bar.close()


def set_aside_later_steps(path: Path, start_step: int) -> int:
    """Move the records of ``path`` with a step after ``start_step`` (all of them for ``-1``) to
    ``<stem>.superseded.jsonl`` beside it (:data:`SUPERSEDED` for ``metrics.jsonl``; appended);
    returns how many moved. The superseded file is written before ``path`` is cut, so a crash in
    between duplicates records rather than losing them."""
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    later = [line for line in lines if json.loads(line)["step"] > start_step]
    if not later:
        return 0
    aside = path.with_name(f"{path.stem}.superseded.jsonl")
    with aside.open("a") as out:
        out.write("".join(line + "\n" for line in later))
    kept = [line for line in lines if json.loads(line)["step"] <= start_step]
    path.write_text("".join(line + "\n" for line in kept))
    log.warning(
        "%s: %d record(s) after step %d, where this run continues, moved to %s",
        path,
        len(later),
        start_step,
        aside,
    )
    return len(later)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_run_config(output_dir: Path, config_dict: dict[str, Any]) -> Path:
    """``<output_dir>/config.yaml``: the run's composed configuration (rewritten on resume)."""
    path = output_dir / RUN_CONFIG
    path.write_text(yaml.safe_dump(config_dict, sort_keys=False))
    return path
