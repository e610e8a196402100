"""The token ids that end a response, read from the model directory: vLLM runs with ``ignore_eos``
(docs/rollout.md), so only these ids stop generation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from opefo_nemo.data.prompt_codec import PromptCodec

log = logging.getLogger(__name__)
_ANSWER = "Final answer 42"
"""Stands for the assistant's content when the chat template is rendered (plain text, so any
tokenizer's template can render it)."""


@dataclass(frozen=True)
class StopTokens:
    """``ids`` end a response; ``sources[i]`` says where ``ids[i]`` came from."""

    ids: tuple[int, ...]
    sources: tuple[str, ...]

    def describe(self, codec: PromptCodec) -> str:
        """``id 'token' (source)`` for every id, comma-separated."""
        return ", ".join(
            f"{i} {codec.tokenizer.convert_ids_to_tokens(i)!r} ({source})"
            for i, source in zip(self.ids, self.sources, strict=True)
        )


def stop_tokens(codec: PromptCodec, override: Sequence[int] | None = None) -> StopTokens:
    """The stop ids of ``codec``'s model: ``override`` (``rollout.stop_token_ids``,
    ``opefo-eval --stop-token-ids``) when given, else derived, in this order without repeats:
    the tokenizer's ``eos_token_id``; ``generation_config.json``'s ``eos_token_id`` (an id or a
    list); the chat template's end-of-turn token. The tokenizer's eos alone is not enough:
    Qwen2.5-Math's and Qwen3's base tokenizers carry a chat template whose turns end with
    ``<|im_end|>`` while their ``eos_token`` is ``<|endoftext|>``."""
    if override is not None:
        return StopTokens(tuple(override), ("configured",) * len(override))
    found: dict[int, str] = {codec.eos_id: "tokenizer eos"}
    for token in _generation_config_eos(codec.model_dir):
        found.setdefault(token, "generation_config.json eos")
    end_of_turn = _chat_template_end_of_turn(codec)
    if end_of_turn is not None:
        found.setdefault(end_of_turn, "chat template end of turn")
    return StopTokens(tuple(found), tuple(found.values()))


def _generation_config_eos(model_dir: Path) -> list[int]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(t) for t in (eos if isinstance(eos, list) else [eos])]


def _chat_template_end_of_turn(codec: PromptCodec) -> int | None:
    """The special token right after the assistant's content in the chat template's rendering;
    ``None`` without a template, or when the template cannot render a plain two-turn chat."""
    tokenizer = codec.tokenizer
    if not codec.has_chat_template:
        return None
    messages = [{"role": "user", "content": "Question"}, {"role": "assistant", "content": _ANSWER}]
    try:
        text = cast(str, tokenizer.apply_chat_template(messages, tokenize=False))  # not tokenized
    except Exception as error:  # a template's own refusal (role order, missing system turn)
        log.warning("the chat template does not render a plain chat (%s): no end-of-turn", error)
        return None
    _, found, after = text.rpartition(_ANSWER)
    if not found or not after.strip():
        return None
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    first = tokenizer.encode(after.lstrip(), add_special_tokens=False)[:1]
    return int(first[0]) if first and first[0] in special else None
