"""Prompt templates: DAPO's "Answer:" instruction, the `\\boxed{}` instruction, the bare problem
and stored chat messages; which verifier each pairs with: docs/rewards_data_eval.md, "Prompt
templates".
"""

from __future__ import annotations

from typing import Any, Protocol

from opefo_nemo.data.problem import Message, Problem

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
BOXED_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."

TEMPLATES = ("dapo", "boxed", "raw", "messages")


class ChatTokenizer(Protocol):
    def apply_chat_template(self, conversation: list[Message], **kwargs: Any) -> Any: ...


def strip_dapo_instruction(text: str) -> str:
    """The bare problem from a user message written with the DAPO template (else `text`)."""
    if text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX):
        return text[len(DAPO_PREFIX) : -len(DAPO_SUFFIX)]
    return text


def prompt_messages(problem: Problem, template: str) -> list[Message]:
    """The chat messages for `problem` under `template` (one of `TEMPLATES`)."""
    if template == "dapo":
        return [{"role": "user", "content": DAPO_PREFIX + problem.problem + DAPO_SUFFIX}]
    if template == "boxed":
        return [{"role": "user", "content": problem.problem + BOXED_SUFFIX}]
    if template == "raw":
        return [{"role": "user", "content": problem.problem}]
    if template == "messages":
        if not problem.messages:
            raise ValueError(
                f"template 'messages' needs stored messages; problem {problem.prompt_id} has none"
            )
        return [dict(message) for message in problem.messages]
    raise ValueError(f"unknown prompt template {template!r}; expected one of {TEMPLATES}")


def render_prompt(problem: Problem, template: str, tokenizer: ChatTokenizer | None = None) -> str:
    """The prompt text: the user message content, or the tokenizer's chat-template rendering
    (`add_generation_prompt=True`, not tokenized) when a tokenizer is given."""
    messages = prompt_messages(problem, template)
    if tokenizer is None:
        return "\n\n".join(message["content"] for message in messages)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(rendered, str):
        raise TypeError(
            f"tokenizer.apply_chat_template returned {type(rendered).__name__}, expected str"
        )
    return rendered
