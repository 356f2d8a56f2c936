"""The OpenAI wire format of the server: request bodies in, ``SamplingParams`` and replies out.

Requests are read into pydantic models that keep unknown fields (clients send many the
server may ignore, such as ``user`` or ``store``); a field that would change what is sampled
and that the engine cannot honour (``presence_penalty``, ``logit_bias``...) is a
400 error, never silently dropped. Replies are the shapes of the OpenAI API: ``choices`` with
``message`` (chat) or ``text`` (completions), ``finish_reason``, optional ``logprobs`` and
``usage``.

Token data for history (``TOKENS_HEADER``): a request carrying this header also gets, per
choice, the exact prompt ids, sampled ids and logprobs under the key ``"trinity"``;
``trinity.common.models.reply_tokens.experiences_from_reply`` turns such a reply back into
the ``Experience``s the engine returned, so a client-side record is token-exact (nothing
re-tokenized from text).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict

from trinity.common.experience import Experience
from trinity.common.models.sampling import SamplingParams


class APIError(Exception):
    """A request the server refuses: HTTP ``status`` and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        code: Optional[str] = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> Dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``, as OpenAI sends it."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


# Type names pydantic adds to an error's location inside a union (``stop.str``); not fields.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "none", "dict", "list"})


def field_path(loc: Sequence[Any]) -> str:
    """An error location as a field path: ``("messages", 2, "role")`` -> ``messages[2].role``
    (pydantic's union member names and the leading ``body`` left out)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif (part == "body" and not path) or part in _TYPE_TAGS or "[" in str(part):
            continue
        else:
            path += f".{part}" if path else str(part)
    return path


def most_specific(errors: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The validation error that says most: the deepest location (inside a union, the
    member the value was meant to be: a list of parts rather than a string)."""
    return max(errors, key=lambda error: len(error.get("loc", ())))


class StreamOptions(BaseModel):
    """``stream_options``: whether a streamed reply ends with a ``usage`` chunk."""

    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: Optional[bool] = None


class _Request(BaseModel):
    """Fields shared by chat and completion requests (``None``: the client did not send it).

    Strict: JSON types are not converted (``"n": "3"`` or ``"n": true`` is a 400, as OpenAI
    answers), and NaN or infinite numbers (which Python's JSON reader accepts) are refused."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str
    n: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None  # extra body field (vLLM's name); <= 0 means no limit
    min_tokens: Optional[int] = None  # extra body field (vLLM's name)
    max_tokens: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None  # extra body field (vLLM's name)
    seed: Optional[int] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[Dict[str, float]] = None

    def unsupported(self) -> None:
        """Raise for a field whose value the engine would not honour."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported yet; leave it unset or 0", name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported yet", "logit_bias")


class ChatRequest(_Request):
    messages: List[Dict[str, Any]]
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    response_format: Optional[Dict[str, Any]] = None

    def unsupported(self) -> None:
        super().unsupported()
        choice = self.tool_choice
        if choice not in (None, "none") and not self.tools:
            raise APIError(400, "when using tool_choice, tools must be set", "tool_choice")
        if choice == "required" or isinstance(choice, dict):
            # vLLM forces these with structured-output decoding, which this engine lacks
            raise APIError(
                400,
                'tool_choice "required" and named functions are not supported yet; use "auto" '
                'or "none"',
                "tool_choice",
            )
        if choice not in (None, "auto", "none"):
            raise APIError(
                400,
                f'invalid tool_choice {choice!r}: use "none", "auto", "required" or a named '
                "function",
                "tool_choice",
            )
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise APIError(
                400, "response_format other than text is not supported yet", "response_format"
            )
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")

    def auto_tool_choice(self) -> bool:
        """Whether the reply's tool calls are to be parsed: tool_choice "auto", which tools
        without a tool_choice also mean (vLLM's and OpenAI's default)."""
        return bool(self.tools) and self.tool_choice in (None, "auto")


class CompletionRequest(_Request):
    prompt: Union[str, List[str], List[int], List[List[int]]]
    logprobs: Optional[int] = None  # this many alternatives per token; 0 = sampled tokens only
    echo: Optional[bool] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.echo:
            raise APIError(400, "echo is not supported yet", "echo")
        if self.suffix:
            raise APIError(400, "suffix is not supported yet", "suffix")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise APIError(400, "best_of other than n is not supported yet", "best_of")

    def prompts(self) -> List[Union[str, List[int]]]:
        """Each prompt: text, or token ids (a list of ints is one prompt of ids)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        if not prompt:
            raise APIError(400, "prompt is empty", "prompt")
        return list(prompt)


def sampling_params(
    request: _Request,
    prompt_tokens: int,
    max_model_len: int,
    max_tokens: Optional[int],
    top_logprobs: int,
    prompt_param: str,
    names: Optional[Dict[str, str]] = None,
) -> SamplingParams:
    """What to sample for one prompt of ``prompt_tokens`` tokens.

    An unset ``max_tokens`` is all the room left in ``max_model_len`` (the configuration
    guide's rule for the API); a prompt that leaves no room, or a ``max_tokens`` that does not
    fit, is a 400 error naming both numbers. ``SamplingParams``' own range checks become 400
    errors naming the field, by the request's name for it when ``names`` maps one
    (``{"max_tokens": "max_completion_tokens"}``).
    """
    names = names or {}
    room = max_model_len - prompt_tokens
    if prompt_tokens == 0:
        raise APIError(400, "the prompt is empty", prompt_param)
    if room < 1:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens, and the prompt has "
            f"{prompt_tokens} tokens, leaving no room for a reply; shorten the prompt",
            prompt_param,
            "context_length_exceeded",
        )
    if max_tokens is not None and max_tokens > room:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_tokens}, so at most {room} can be generated, but "
            f"{names.get('max_tokens', 'max_tokens')} is {max_tokens}",
            names.get("max_tokens", "max_tokens"),
            "context_length_exceeded",
        )
    stop = [request.stop] if isinstance(request.stop, str) else request.stop
    values = dict(
        n=request.n,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        min_tokens=request.min_tokens if request.min_tokens is not None else 0,
        max_tokens=max_tokens if max_tokens is not None else room,
        stop=stop or None,
        stop_token_ids=request.stop_token_ids,
        seed=request.seed,
        top_logprobs=top_logprobs,
        truncate_prompt=False,  # the guide: prompts through the API are never cut
    )
    try:
        return SamplingParams(**{k: v for k, v in values.items() if v is not None})
    except ValueError as exc:  # "SamplingParams.<field> must be ..."
        message = str(exc).replace("SamplingParams.", "")
        field = message.split(" ", 1)[0]
        param = names.get(field, field)
        raise APIError(400, param + message[len(field) :], param) from None


@dataclass
class Sampled:
    """One prompt's samples, as the engine returned them."""

    prompt_ids: List[int]
    experiences: List[Experience]


def _token_text(decode: Callable[[List[int]], str], token_id: int) -> Dict[str, Any]:
    text = decode([token_id])
    return {"token": text, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(exp: Experience, decode: Callable[[List[int]], str]) -> Dict[str, Any]:
    """``choice.logprobs`` of a chat reply: every sampled token (the end-of-turn token and a
    stop string's tokens included: they are what the trainer sees), with its alternatives."""
    tops = exp.info.get("top_logprobs") or []
    content = []
    for t, (token_id, logprob) in enumerate(
        zip(exp.tokens[exp.prompt_length :].tolist(), exp.logprobs.tolist(), strict=True)
    ):
        alternatives = tops[t] if t < len(tops) else []
        content.append(
            {
                **_token_text(decode, token_id),
                "logprob": logprob,
                "top_logprobs": [
                    {**_token_text(decode, i), "logprob": lp} for i, lp in alternatives
                ],
            }
        )
    return {"content": content}


def completion_logprobs(exp: Experience, decode: Callable[[List[int]], str]) -> Dict[str, Any]:
    """``choice.logprobs`` of a completion: parallel lists of tokens, their logprobs, their
    alternatives (token -> logprob) and each token's offset in the concatenated tokens."""
    ids = exp.tokens[exp.prompt_length :].tolist()
    tokens = [decode([i]) for i in ids]
    tops = exp.info.get("top_logprobs") or [[] for _ in ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": exp.logprobs.tolist(),
        "top_logprobs": [{decode([i]): lp for i, lp in step} for step in tops],
        "text_offset": offsets,
    }


def token_block(prompt_index: int, exp: Experience) -> Dict[str, Any]:
    """A choice's ``"trinity"`` entry: what rebuilds the engine's ``Experience`` exactly."""
    return {
        "prompt": prompt_index,
        "token_ids": exp.tokens[exp.prompt_length :].tolist(),
        "logprobs": exp.logprobs.tolist(),
        "response_text": exp.response_text,
        "model_version": exp.model_version,
        "info": exp.info,
    }


def prompt_blocks(sampled: List[Sampled]) -> List[Dict[str, Any]]:
    """The reply's top-level ``"trinity": {"prompts": [...]}``: each prompt's ids and text,
    sent once however many choices share it."""
    return [
        {
            "token_ids": s.experiences[0].tokens[: s.experiences[0].prompt_length].tolist(),
            "text": s.experiences[0].prompt_text,
        }
        for s in sampled
    ]


def usage(sampled: List[Sampled]) -> Dict[str, int]:
    """Token counts: every prompt once, every sampled token of every choice."""
    prompt = sum(len(s.prompt_ids) for s in sampled)
    completion = sum(e.response_length for s in sampled for e in s.experiences)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def envelope(kind: str, model: str) -> Dict[str, Any]:
    """The fields every reply starts with: id, object, created, model."""
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }
