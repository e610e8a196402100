"""Problems → prompt token ids, and response ids → text, with the model directory's tokenizer.

The tokenizer is ``<model>/tokenizer/`` when present (the tiny model keeps its character-level
tokenizer there) else ``<model>/``. With a chat template the prompt is the template's rendering of
``data.template``'s messages; without one it is the raw prompt text after the BOS token (if any).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from opefo_nemo.data import Problem, render_prompt


class PromptCodec:
    """Encodes prompts and decodes responses for one model directory."""

    def __init__(self, model_dir: str | Path, template: str):
        from transformers import AutoTokenizer

        root = Path(model_dir)
        self.model_dir = root
        path = root / "tokenizer" if (root / "tokenizer").is_dir() else root
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.template = template
        self.has_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer at {path} has no eos token: generation could not stop")

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def encode(self, problem: Problem) -> list[int]:
        """Prompt token ids of ``problem``."""
        if self.has_chat_template:
            text = render_prompt(problem, self.template, self.tokenizer)
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        ids = list(
            self.tokenizer.encode(render_prompt(problem, self.template), add_special_tokens=False)
        )
        bos = self.tokenizer.bos_token_id
        return ([int(bos)] if bos is not None else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return cast(str, text)  # one sequence of ids decodes to one string


@dataclass(frozen=True)
class EncodedProblems:
    """Problems whose prompts fit ``max_prompt_tokens``, their prompt ids, and how many were
    skipped for being longer."""

    problems: list[Problem]
    prompts: list[list[int]]
    skipped_long: int


def encode_problems(
    problems: Sequence[Problem],
    codec: PromptCodec,
    max_prompt_tokens: int,
    long_prompt: str,
    what: str,
) -> EncodedProblems:
    """Encode every problem; a prompt over the limit is skipped and counted (``long_prompt:
    skip``) or an error naming it (``error``). An empty result is an error naming ``what``."""
    kept, prompts, skipped = [], [], 0
    for problem in problems:
        ids = codec.encode(problem)
        if len(ids) > max_prompt_tokens:
            if long_prompt == "error":
                raise ValueError(
                    f"{what}: prompt {problem.prompt_id} has {len(ids)} tokens, over "
                    f"data.max_prompt_tokens={max_prompt_tokens} "
                    "(set data.long_prompt=skip to drop it)"
                )
            skipped += 1
            continue
        kept.append(problem)
        prompts.append(ids)
    if not kept:
        raise ValueError(
            f"{what}: no usable problem ({len(problems)} loaded, {skipped} longer than "
            f"data.max_prompt_tokens={max_prompt_tokens})"
        )
    return EncodedProblems(kept, prompts, skipped)
