"""The token data a reply of the project's OpenAI-compatible server carries, both sides of it.

A request with ``TOKENS_HEADER`` gets, per choice, the exact prompt ids, sampled ids and
logprobs under the key ``"trinity"`` (the server writes them: ``engine/openai_protocol.py``);
``experiences_from_reply`` turns such a reply back into the ``Experience``s the engine
returned (the recording clients of ``client.py`` read them). It sits here, below both, so
``ModelWrapper``'s clients need nothing of the engine package.
"""

from __future__ import annotations

from typing import Any, Dict, List

from trinity.common.experience import Experience

TOKENS_HEADER = "x-trinity-return-tokens"
# Keeps the reply's token data on the server under this key, for the caller to take later
# (``trinity.engine.records``): calls made by a program the workflow cannot hook.
RECORD_HEADER = "x-trinity-record"
# Names the caller's conversations: a chat request continuing one of the session's recent
# turns is continued from its tokens (``trinity.engine.conversation``).
SESSION_HEADER = "x-trinity-session"


def experiences_from_reply(body: Dict[str, Any]) -> List[Experience]:
    """The engine's ``Experience``s behind a reply that carried token data, in choice order
    (empty for a reply without it)."""
    block = body.get("trinity") if isinstance(body, dict) else None
    if not block:
        return []
    prompts = block["prompts"]
    experiences = []
    for choice in body.get("choices", []):
        data = choice["trinity"]
        prompt = prompts[data["prompt"]]
        experiences.append(
            Experience(
                tokens=prompt["token_ids"] + data["token_ids"],
                prompt_length=len(prompt["token_ids"]),
                logprobs=data["logprobs"],
                prompt_text=prompt["text"],
                response_text=data["response_text"],
                model_version=data["model_version"],
                info=data["info"],
            )
        )
    return experiences
