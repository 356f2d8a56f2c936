"""Reasoning in a reply's text, split from its answer for the OpenAI API's
``reasoning_content``.

Thinking models write their reasoning between ``<think>`` and ``</think>`` before the
answer. Some templates open the block in the prompt (DeepSeek-R1), so the reply holds only
``...</think>answer``; others (Qwen3) leave both tags to the model. A parser is chosen per
served model (``explorer.rollout_model.reasoning_parser``); its names and rules are data:

- ``deepseek_r1``: a reply without ``</think>`` is still reasoning (cut off by
  ``max_tokens``): all of it is ``reasoning_content``.
- ``qwen3``: a reply without ``</think>`` did not think (``enable_thinking: false`` and no
  block): all of it is ``content``.

What the client sees changes, not what is recorded: history keeps the exact tokens sampled.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

START, END = "<think>", "</think>"

# parser name -> whether a reply with no closing tag is reasoning (else it is the answer)
REASONING_PARSERS: Dict[str, bool] = {"deepseek_r1": True, "qwen3": False}


def split_reasoning(text: str, parser: str) -> Tuple[Optional[str], Optional[str]]:
    """(reasoning, content) of ``text`` by ``parser``; either is None when empty."""
    before, closed, after = text.partition(END)
    if not closed:
        unclosed_is_reasoning = REASONING_PARSERS[parser] or text.lstrip().startswith(START)
        before, after = (text, "") if unclosed_is_reasoning else ("", text)
    reasoning = before.strip().removeprefix(START).strip()
    content = after.strip()
    return reasoning or None, content or None
