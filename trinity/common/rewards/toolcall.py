"""``tool_call_reward``: the tool calls a response makes against the reference calls (Tool-N1).

The reward of the original Trinity-RFT's ToolACE workflow (``toolcall_workflow``), after
Tool-N1 (arXiv:2505.00024): ``accuracy`` is 1.0 only when all of these hold, else 0.0:

- the response holds exactly one ``<think>`` and one ``</think>``, the thinking closed before
  the first ``<tool_call>``;
- the last ``<tool_call>...</tool_call>`` holds JSON: a list of calls (one call alone counts
  as a list of one), each an object with ``name`` and ``arguments``;
- those calls are the reference's, in any order: the same multiset of (name, arguments);
  no call is right only when the reference makes none.

The reference (``truth``) is the calls as JSON text, a list of ``{"name", "arguments"}``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Dict, List, Optional

from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _json(text: Any) -> Any:
    """``text`` decoded (twice when it is JSON of a JSON string), None when it is not JSON."""
    for _ in range(2):
        if not isinstance(text, str):
            return text
        try:
            text = json.loads(text)
        except json.JSONDecodeError:
            return None
    return text


def response_calls(response: str) -> Optional[List[Any]]:
    """The calls in the last ``<tool_call>`` block, None when there is none or it is no JSON."""
    blocks = _TOOL_CALL.findall(response)
    calls = _json(blocks[-1].strip()) if blocks else None
    return [calls] if isinstance(calls, dict) else calls


def thinks_before_calling(response: str) -> bool:
    """One ``<think>``, one ``</think>``, and the thinking closed before any tool call."""
    if response.count("<think>") != 1 or response.count("</think>") != 1:
        return False
    call = response.find("<tool_call>")
    return call == -1 or response.find("</think>") < call


def _signature(calls: List[Dict[str, Any]]) -> Counter:
    return Counter((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in calls)


def same_calls(calls: Any, reference: Any) -> bool:
    """``calls`` is a well-formed list and makes the reference's calls, in any order."""
    if not isinstance(calls, list) or not isinstance(reference, list):
        return False
    if not all(isinstance(c, dict) and {"name", "arguments"} <= c.keys() for c in calls):
        return False
    if not calls or not reference:
        return not calls and not reference
    try:
        return _signature(calls) == _signature(reference)
    except (TypeError, KeyError):  # arguments that are no JSON, or a reference call without them
        return False


def tool_call_score(response: str, truth: Optional[str]) -> float:
    """1.0 when the response thinks once and then makes exactly the reference's calls."""
    if truth is None:
        return 0.0
    calls = response_calls(response)
    if calls is None or not thinks_before_calling(response):
        return 0.0
    return float(same_calls(calls, _json(truth)))


@REWARD_FUNCTIONS.register_module("tool_call_reward")
class ToolCallReward(RewardFn):
    """``accuracy``: the response's tool calls are the reference's (``tool_call_score``)."""

    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        return {"accuracy": tool_call_score(response, truth)}
