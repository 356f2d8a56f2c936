"""Reasoning in a reply's text, split from its answer for the OpenAI API's
``reasoning_content``, as vLLM's reasoning parsers of the same names split it.

Thinking models write their reasoning between ``<think>`` and ``</think>`` before the
answer. Some templates open the block in the prompt, so the reply holds only
``...</think>answer``. A parser is chosen per served model
(``explorer.rollout_model.reasoning_parser``); both read a reply as reasoning until it
closes the block:

- ``deepseek_r1``: what precedes a ``<think>`` is dropped; the reasoning runs to the first
  ``</think>``, the answer is the rest. A reply without ``</think>`` (cut off by
  ``max_tokens``, or a model that never closed it) is all reasoning.
- ``qwen3``: with the served model's ``enable_thinking`` true, the same, except that
  ``<think>`` tags are dropped wherever they stand in the reasoning, a ``<tool_call>`` also
  ends it (the call is the answer's), and a second ``</think>`` is dropped from the answer.
  With ``enable_thinking`` false (the template closed an empty block in the prompt) the
  whole reply is the answer, tags included.

Unlike vLLM, surrounding whitespace is stripped from both parts (the blank lines a template
puts after ``</think>``), and an empty part is None. What the client sees changes, not what
is recorded: history keeps the exact tokens sampled.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

START, END, TOOL_CALL = "<think>", "</think>", "<tool_call>"

Split = Tuple[str, str]  # (reasoning, answer), not yet stripped


def _deepseek_r1(text: str, thinking: bool) -> Split:
    """vLLM's ``deepseek_r1``: the template opens the block, so there is no "not thinking"."""
    _, opened, rest = text.partition(START)
    text = rest if opened else text
    reasoning, closed, answer = text.partition(END)
    return (reasoning, answer) if closed else (text, "")


def _qwen3(text: str, thinking: bool) -> Split:
    """vLLM's ``qwen3``: reasoning first unless thinking is off, up to ``</think>`` or a tool
    call, whichever comes first."""
    if not thinking:
        return "", text
    ends = [(text.find(marker), marker) for marker in (END, TOOL_CALL) if marker in text]
    if not ends:
        return text.replace(START, ""), ""
    at, marker = min(ends)
    reasoning = text[:at].replace(START, "")
    answer = text[at + len(END) :] if marker == END else text[at:]
    return reasoning, answer.replace(END, "")


REASONING_PARSERS: Dict[str, Callable[[str, bool], Split]] = {
    "deepseek_r1": _deepseek_r1,
    "qwen3": _qwen3,
}


def split_reasoning(
    text: str, parser: str, thinking: bool = True
) -> Tuple[Optional[str], Optional[str]]:
    """(reasoning, content) of ``text`` by ``parser``; either is None when empty.

    ``thinking``: the ``enable_thinking`` the chat template was rendered with.
    """
    reasoning, answer = REASONING_PARSERS[parser](text, thinking)
    return reasoning.strip() or None, answer.strip() or None
