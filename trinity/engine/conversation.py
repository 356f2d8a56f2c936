"""Token-exact multi-turn prompts: each turn's prompt continues the previous turn's tokens.

A workflow (or an agent behind the OpenAI client) sends whole conversations as text. Rendering
turn ``k+1``'s conversation with the chat template again would re-tokenize the model's own
earlier reply from its text, and the tokens differ from those it sampled whenever it emitted
special tokens (dropped from the reply text) or text that tokenizes another way. The trainer
would then learn from tokens the model never produced.

``Conversation`` remembers the recent turns of one session: their messages, prompt ids and the
sampled ids of each reply. When a new conversation is one of those plus one of its replies (as
the API returned it) plus new messages, the prompt is built from tokens:
``previous prompt + sampled reply + tokens of what the template puts after the reply``. Only
the new part is rendered from text; anything else is rendered from scratch. Keeping several
turns lets episodes that share a session run side by side, and lets branches (several samples
continued separately) each continue their own reply.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

Messages = List[Dict[str, Any]]
# (messages, tools, add_generation_prompt) -> the chat template's text
Render = Callable[[Messages, Optional[List[Dict[str, Any]]], bool], str]

# Stands in for the reply's text while rendering what follows it; never in real text.
_SENTINEL = "\x00trinity-reply\x00"


@dataclass
class Turn:
    """One call of an episode: what was sent, the prompt used, and each reply."""

    messages: Messages
    tools: Optional[List[Dict[str, Any]]]
    prompt_ids: List[int]
    replies: List[Tuple[Dict[str, Any], List[int]]]  # (assistant message returned, sampled ids)


class Conversation:
    """Prompt ids for the turns of the episodes of one session (one model wrapper).

    Args:
        render: the chat template as text (``tokenizer.apply_chat_template(..., tokenize=False)``).
        encode: text -> token ids, without adding special tokens.
        decode: token ids -> text, special tokens kept.
        end_ids: ids that end a reply and that the template also writes after one (eos, the
            end-of-turn token); a reply that ends with one is not closed a second time.
        keep: how many recent turns may be continued.
    """

    def __init__(
        self,
        render: Render,
        encode: Callable[[str], List[int]],
        decode: Callable[[List[int]], str],
        end_ids: Set[int],
        keep: int = 64,
    ) -> None:
        self.render, self.encode, self.decode, self.end_ids = render, encode, decode, end_ids
        self.turns: deque = deque(maxlen=keep)  # the most recent turns, newest last

    def prompt_ids(
        self, messages: Messages, tools: Optional[List[Dict[str, Any]]] = None
    ) -> List[int]:
        """The prompt for ``messages``: a recorded turn's tokens continued, where one applies."""
        continued = self._continued(messages, tools)
        if continued is not None:
            return continued
        return self.encode(self.render(messages, tools, True))

    def record(
        self,
        messages: Messages,
        tools: Optional[List[Dict[str, Any]]],
        prompt_ids: List[int],
        replies: Sequence[Tuple[Dict[str, Any], List[int]]],
    ) -> None:
        """Remember a finished call; a later one may continue any of its replies."""
        turn = Turn(copy.deepcopy(messages), copy.deepcopy(tools), list(prompt_ids), list(replies))
        self.turns.append(turn)

    def _continued(
        self, messages: Messages, tools: Optional[List[Dict[str, Any]]]
    ) -> Optional[List[int]]:
        """The newest recorded turn this conversation extends by one of its replies."""
        for turn in reversed(self.turns):
            k = len(turn.messages)
            if tools != turn.tools or len(messages) <= k or messages[:k] != turn.messages:
                continue
            sampled = _matching_reply(messages[k], turn.replies)
            after = None if sampled is None else self._after_reply(messages, k, tools)
            if after is None:
                continue
            if sampled and sampled[-1] in self.end_ids:
                end = self.decode(sampled[-1:])
                after = after[len(end) :] if after.startswith(end) else after
            return turn.prompt_ids + sampled + self.encode(after)
        return None

    def _after_reply(self, messages: Messages, k: int, tools: Any) -> Optional[str]:
        """What the template writes after reply ``k``'s content, up to the generation prompt.

        The reply is rendered as a placeholder without tool calls: its sampled tokens already
        hold the model's own text for them.
        """
        stand_in = copy.deepcopy(messages)
        stand_in[k] = {"role": "assistant", "content": _SENTINEL}
        text = self.render(stand_in, tools, True)
        if text.count(_SENTINEL) != 1:
            return None
        return text.split(_SENTINEL, 1)[1]


def engine_conversation(engine: Any) -> Conversation:
    """A ``Conversation`` over a ``TransformersEngine``'s tokenizer and chat template."""
    tokenizer = engine.tokenizer
    return Conversation(
        engine.render_chat,
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        set(engine.eos_ids) | set(tokenizer.all_special_ids),
    )


def record_turn(
    conversation: Conversation,
    messages: Messages,
    tools: Optional[List[Dict[str, Any]]],
    replies: Sequence[Tuple[Dict[str, Any], Any]],
) -> None:
    """Record a call whose ``replies`` are (assistant message returned, its ``Experience``):
    the prompt the engine used and each reply's sampled ids come from the experiences."""
    if not replies:
        return
    first = replies[0][1]
    prompt = first.tokens[: first.prompt_length].tolist()
    sampled = [(m, e.tokens[e.prompt_length :].tolist()) for m, e in replies]
    conversation.record(messages, tools, prompt, sampled)


def _matching_reply(
    message: Dict[str, Any], replies: List[Tuple[Dict[str, Any], List[int]]]
) -> Optional[List[int]]:
    """The sampled ids of the reply ``message`` repeats (content and tool calls), if any."""
    if message.get("role") != "assistant":
        return None
    for returned, sampled in replies:
        if _same_reply(message, returned):
            return sampled
    return None


def _same_reply(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return (a.get("content") or "") == (b.get("content") or "") and _calls(a) == _calls(b)


def _calls(message: Dict[str, Any]) -> List[Tuple[str, Any]]:
    """(name, arguments) of a message's tool calls; arguments compared as JSON values."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append((function.get("name"), arguments))
    return calls
