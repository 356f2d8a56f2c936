"""The OpenAI-compatible HTTP server in front of a rollout engine.

``build_app`` makes one ASGI app (FastAPI) over a ``ServedModel``: ``GET /v1/models``,
``POST /v1/chat/completions`` and ``POST /v1/completions``. Each request becomes one
``generate_ids`` call per prompt on the engine, the call ``ModelWrapper.chat`` makes too, so
requests from many clients batch in the engine exactly as direct calls do. ``RunningServer``
serves the app with uvicorn as a task on the running event loop (the engine actor's), on a
socket bound before the task starts: port 0 gives a free port, known at once. A request
with ``stream: true`` gets its finished reply as server-sent events (``sse.py``); one with
``RECORD_HEADER`` leaves its token data on the server for ``POST /trinity/records/take``
(``records.py``).

Errors are OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``): 400 for a
prompt that leaves no room in ``max_model_len``, a bad or unsupported parameter, or messages
the chat template cannot render; 404 for another model name or path; 500 when the engine
fails. No request waits on anything but its own batch.

Tools, as vLLM serves them: a request's ``tools`` always reach the chat template; with
``tool_choice`` "auto" (or unset) the reply's tool calls are parsed (``tool_call_parser``),
which the model's ``enable_auto_tool_choice`` must allow (else a 400 naming the key, as vLLM
refuses without ``--enable-auto-tool-choice``); "none" returns the text as it is.

In ``mode: serve`` (``hooks``) the same app also records every reply for training and takes
rewards and commits from clients (``serve_routes.py``): one server, not a proxy in front.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.common.models.reply_tokens import RECORD_HEADER, SESSION_HEADER, TOKENS_HEADER
from trinity.common.models.sampling import SamplingParams
from trinity.engine.conversation import Conversation, record_turn
from trinity.engine.guard import Guard, head_deadline_protocol
from trinity.engine.openai_protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    Sampled,
    chat_logprobs,
    completion_logprobs,
    envelope,
    field_path,
    most_specific,
    prompt_blocks,
    sampling_params,
    token_block,
    usage,
)
from trinity.engine.reasoning import split_reasoning
from trinity.engine.records import RecordStore, add_record_routes
from trinity.engine.request_checks import check_chat, check_sampling
from trinity.engine.serve_routes import (
    ServeHooks,
    add_serve_routes,
    sample_at_training_temperature,
)
from trinity.engine.sse import streamed
from trinity.engine.tool_calls import arguments_as_objects, parse_tool_calls
from trinity.utils.access import Secret

logger = logging.getLogger(__name__)

# vLLM's refusal of tool_choice "auto" without --enable-auto-tool-choice, naming our key.
AUTO_TOOL_CHOICE_OFF = (
    '"auto" tool choice (also meant by tools without a tool_choice) requires '
    "enable_auto_tool_choice: true on this model (explorer.rollout_model or its "
    "explorer.auxiliary_models entry; vLLM's --enable-auto-tool-choice); or send "
    'tool_choice "none"'
)

Messages = List[Dict[str, Any]]


@dataclass
class ServedModel:
    """What the server needs from an engine: sampling from token ids, and its tokenizer.

    ``model`` is an ``InferenceModel`` (only ``generate_ids`` is called). ``name`` is the id
    ``/v1/models`` lists; requests may name it or one of ``aliases``.
    """

    model: Any
    name: str
    max_model_len: int
    vocab_size: int
    chat_ids: Callable[[Messages, Optional[Messages]], List[int]]  # messages, tools -> ids
    text_ids: Callable[[str], List[int]]
    decode: Callable[[List[int]], str]  # special tokens kept: a token's own text
    aliases: Tuple[str, ...] = ()
    conversation: Optional[Callable[[str], Conversation]] = None  # session -> its turns
    reasoning_parser: Optional[str] = None  # a REASONING_PARSERS name: <think> apart
    enable_thinking: bool = False  # what chat_ids renders the template with; qwen3 reads it
    tool_call_parser: str = "hermes"  # a TOOL_CALL_PARSERS name
    enable_auto_tool_choice: bool = False  # tool_choice auto is served (vLLM's flag)

    @classmethod
    def from_transformers(cls, model: Any, name: str) -> ServedModel:
        """Serve a ``TransformersInferenceModel`` (or a subclass: vllm's) as ``name`` (alias:
        its folder's basename)."""
        engine = model.engine
        return cls(
            model=model,
            name=name,
            max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size,
            chat_ids=engine.apply_chat_template,
            text_ids=engine.encode_prompt,
            decode=lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=False),
            aliases=(os.path.basename(os.path.normpath(name)),),
            conversation=model.conversation,
            reasoning_parser=engine.reasoning_parser,
            enable_thinking=engine.template_kwargs["enable_thinking"],
            tool_call_parser=engine.tool_call_parser,
            enable_auto_tool_choice=engine.enable_auto_tool_choice,
        )

    def check_name(self, requested: str) -> None:
        if requested != self.name and requested not in self.aliases:
            raise APIError(
                404,
                f"The model `{requested}` does not exist; this server serves `{self.name}` "
                "(see GET /v1/models)",
                "model",
                "model_not_found",
            )

    async def sample(self, prompt_ids: List[int], params: SamplingParams) -> Sampled:
        """The engine's samples for one prompt; its failures as OpenAI errors."""
        try:
            experiences = await self.model.generate_ids(prompt_ids, params)
        except ValueError as exc:  # the engine refused the request
            raise APIError(400, str(exc)) from None
        except Exception as exc:
            logger.exception("generation failed")
            raise APIError(500, f"generation failed: {exc}", kind="server_error") from None
        return Sampled(prompt_ids, experiences)


class _JSON(JSONResponse):
    """Compact JSON; a logprob of -inf is written as -Infinity (Python clients read it)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _error(exc: APIError) -> _JSON:
    return _JSON(exc.body(), status_code=exc.status)


def _text_messages(messages: Messages) -> Messages:
    """Messages with list-of-parts content joined into one string (text parts only)."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                where = f"messages[{i}].content"
                raise APIError(400, f"{where}: only text parts are supported", where)
            message = {**message, "content": "".join(p.get("text", "") for p in content)}
        out.append(message)
    return out


def _prompt_ids(served: ServedModel, prompt: Union[str, List[int]], index: int) -> List[int]:
    if isinstance(prompt, str):
        return served.text_ids(prompt)
    bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < served.vocab_size]
    if bad:
        raise APIError(
            400,
            f"prompt[{index}] has token ids outside [0, {served.vocab_size}): {bad[:5]}",
            "prompt",
        )
    return list(prompt)


def build_app(
    served: ServedModel,
    hooks: Optional[ServeHooks] = None,
    limits: Optional[APIServerConfig] = None,
    api_key: Optional[Secret] = None,
) -> FastAPI:
    """The OpenAI-compatible app over ``served``; see the module docstring. With ``hooks``
    (``mode: serve``) every reply is recorded before it is sent, and the app has the serve
    routes (``serve_routes.py``). ``limits`` (unset: the defaults of
    ``explorer.api_server``) bound every request; with ``api_key`` every route requires it
    (``guard.py``)."""
    limits = limits if limits is not None else APIServerConfig()
    app = FastAPI(title="Trinity-RFT rollout model", docs_url=None, redoc_url=None)
    app.add_middleware(Guard, limits=limits, api_key=api_key)
    created = int(time.time())
    if hooks is not None:
        add_serve_routes(app, hooks, served.model)
    records = RecordStore()
    add_record_routes(app, records)
    _add_error_handlers(app)

    @app.get("/v1/models")
    async def models() -> _JSON:
        card = {
            "id": served.name,
            "object": "model",
            "created": created,
            "owned_by": "trinity-rft",
            "max_model_len": served.max_model_len,
        }
        return _JSON({"object": "list", "data": [card]})

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        reply, sampled = await _chat(served, hooks, limits, body, request)
        return _respond(request, body, reply, sampled, records)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        reply, sampled = await _completions(served, hooks, limits, body)
        return _respond(request, body, reply, sampled, records)

    return app


async def _chat(
    served: ServedModel,
    hooks: Optional[ServeHooks],
    limits: APIServerConfig,
    body: ChatRequest,
    request: Request,
) -> Tuple[Dict[str, Any], List[Sampled]]:
    """``POST /v1/chat/completions``: the reply and what was sampled for it."""
    served.check_name(body.model)
    body.unsupported()
    check_chat(body, limits, served.vocab_size)
    if body.auto_tool_choice() and not served.enable_auto_tool_choice:
        raise APIError(400, AUTO_TOOL_CHOICE_OFF, "tool_choice")
    await _before_sampling(hooks, body)
    messages = arguments_as_objects(_text_messages(body.messages))
    session = request.headers.get(SESSION_HEADER)
    conversation = served.conversation(session) if session and served.conversation else None
    prompt = _chat_prompt(served, conversation, messages, body.tools)
    limit, names = body.max_tokens, {}
    if body.max_completion_tokens is not None:  # OpenAI's newer name wins
        limit, names = body.max_completion_tokens, {"max_tokens": "max_completion_tokens"}
    top = (body.top_logprobs or 0) if body.logprobs else 0
    params = sampling_params(body, len(prompt), served.max_model_len, limit, top, "messages", names)
    sampled = await served.sample(prompt, params)
    choices = [_chat_choice(served, body, i, exp) for i, exp in enumerate(sampled.experiences)]
    if conversation is not None:  # the next turn may continue any of these replies
        replies = [c["message"] for c in choices]
        pairs = list(zip(replies, sampled.experiences, strict=True))
        record_turn(conversation, messages, body.tools, pairs)
    reply = {**envelope("chat.completion", served.name), "choices": choices}
    await _record(hooks, reply["id"], [sampled])
    return reply, [sampled]


async def _completions(
    served: ServedModel,
    hooks: Optional[ServeHooks],
    limits: APIServerConfig,
    body: CompletionRequest,
) -> Tuple[Dict[str, Any], List[Sampled]]:
    """``POST /v1/completions``: the reply and what was sampled for it."""
    served.check_name(body.model)
    body.unsupported()
    await _before_sampling(hooks, body)
    check_sampling(body, limits, served.vocab_size, len(body.prompts()))
    prompts = [_prompt_ids(served, p, i) for i, p in enumerate(body.prompts())]
    top, names = body.logprobs or 0, {"top_logprobs": "logprobs"}
    params = [
        sampling_params(body, len(p), served.max_model_len, body.max_tokens, top, "prompt", names)
        for p in prompts
    ]
    sampled = list(
        await asyncio.gather(*(served.sample(p, q) for p, q in zip(prompts, params, strict=True)))
    )
    exps = [exp for group in sampled for exp in group.experiences]
    choices = [_completion_choice(served, body, i, exp) for i, exp in enumerate(exps)]
    reply = {**envelope("text_completion", served.name), "choices": choices}
    await _record(hooks, reply["id"], sampled)
    return reply, sampled


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves as an OpenAI-shaped body with its status."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> _JSON:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> _JSON:
        first = most_specific(exc.errors())
        if first.get("type") == "json_invalid":  # FastAPI's: the body is not JSON
            why = (first.get("ctx") or {}).get("error", "")
            return _error(APIError(400, f"body: not JSON ({why})"))
        param = field_path(first.get("loc", ())) or None
        return _error(APIError(400, f"{param or 'body'}: {first.get('msg')}", param))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> _JSON:
        return _error(APIError(exc.status_code, str(exc.detail)))


async def _before_sampling(hooks: Optional[ServeHooks], body: Any) -> None:
    """Mode serve: a request is refused once training stopped (503), and samples at the
    trainer's temperature."""
    if hooks is not None:
        await hooks.available()
        sample_at_training_temperature(hooks, body)


async def _record(hooks: Optional[ServeHooks], reply_id: str, sampled: List[Sampled]) -> None:
    """Mode serve: keep the reply's choices, in choice order, before it is sent."""
    if hooks is not None:
        await hooks.record(reply_id, [exp for group in sampled for exp in group.experiences])


def _chat_prompt(served: ServedModel, conversation: Any, messages: List, tools: Any) -> List[int]:
    """The prompt ids: continuing a recorded turn of the session, else the template's."""
    try:
        if conversation is not None:
            return conversation.prompt_ids(messages, tools)
        return served.chat_ids(messages, tools)
    except Exception as exc:  # jinja errors of the model's own template
        raise APIError(
            400, f"the chat template cannot render these messages: {exc}", "messages"
        ) from None


def _chat_choice(served: ServedModel, body: ChatRequest, index: int, exp: Any) -> Dict[str, Any]:
    """One ``choices`` item of a chat completion: the reasoning apart when the model has a
    reasoning parser, then tool calls parsed from the rest when tools were given."""
    reasoning, content = None, exp.response_text
    if served.reasoning_parser:
        reasoning, content = split_reasoning(
            content, served.reasoning_parser, served.enable_thinking
        )
    if body.auto_tool_choice() and content:
        content, calls = parse_tool_calls(content, served.tool_call_parser)
    else:
        calls = []
    message: Dict[str, Any] = {"role": "assistant", "content": content}
    if served.reasoning_parser:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(exp, served.decode) if body.logprobs else None,
        "finish_reason": "tool_calls" if calls else exp.info["finish_reason"],
        "stop_reason": exp.info.get("stop_reason"),
    }


def _completion_choice(
    served: ServedModel, body: CompletionRequest, index: int, exp: Any
) -> Dict[str, Any]:
    """One ``choices`` item of a (text) completion, prompts and their samples in order."""
    logprobs = body.logprobs is not None
    return {
        "index": index,
        "text": exp.response_text,
        "logprobs": completion_logprobs(exp, served.decode) if logprobs else None,
        "finish_reason": exp.info["finish_reason"],
        "stop_reason": exp.info.get("stop_reason"),
    }


def _respond(
    request: Request,
    body: Any,
    reply: Dict[str, Any],
    sampled: List[Sampled],
    records: RecordStore,
) -> Response:
    """``reply`` with ``usage`` as JSON or as a stream (``stream: true``); its exact token
    data attached when the request asked for it (``TOKENS_HEADER``) and kept under the
    request's record key (``RECORD_HEADER``, ``records.py``)."""
    reply["usage"] = usage(sampled)
    key = request.headers.get(RECORD_HEADER)
    if key or TOKENS_HEADER in request.headers:
        prompts = {"prompts": prompt_blocks(sampled)}
        pairs = [(p, e) for p, group in enumerate(sampled) for e in group.experiences]
        blocks = [token_block(prompt_index, exp) for prompt_index, exp in pairs]
        if key:
            records.add(key, {"trinity": prompts, "choices": [{"trinity": b} for b in blocks]})
        if TOKENS_HEADER in request.headers:
            reply["trinity"] = prompts
            for choice, block in zip(reply["choices"], blocks, strict=True):
                choice["trinity"] = block
    return streamed(reply, body) if body.stream else _JSON(reply)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free port the OS picks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections wait in the backlog until uvicorn starts accepting
    except OSError:
        sock.close()
        raise
    return sock


class RunningServer:
    """``app`` served by uvicorn as a task on the running event loop.

    Create it inside that loop (an async actor's ``__init__`` runs there). ``host`` and
    ``port`` are where it listens, fixed before the constructor returns. A connection whose
    request head takes longer than ``read_timeout`` seconds is closed (``guard.py``).
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        read_timeout: float = APIServerConfig().read_timeout,
    ) -> None:
        self.socket = bind(host, port)
        self.host, self.port = self.socket.getsockname()[:2]
        config = uvicorn.Config(
            app,
            http=head_deadline_protocol(read_timeout),
            log_config=None,  # leave logging to the process (an actor logs to its own file)
            access_log=False,
            lifespan="off",
            # Longer than clients keep idle connections (httpx: 5 s), so a client never
            # reuses a connection the server is closing.
            timeout_keep_alive=30,
        )
        self.server = uvicorn.Server(config)
        self.task = asyncio.get_running_loop().create_task(self.server.serve([self.socket]))

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        """Stop accepting, finish the requests in flight, and release the socket."""
        self.server.should_exit = True
        await self.task
        self.socket.close()


def serve_engine(
    model: Any,
    model_path: str,
    where: Dict[str, Any],
) -> RunningServer:
    """The OpenAI-compatible API of ``model`` (an engine with ``served_model``, holding
    ``model_path``) on the running loop, as ``where`` says (``runtime/explorer_role.py:
    openai_api``: ``host``, ``port``, ``limits``, ``api_key``, and in mode serve the
    ``serve`` hooks, which add the serve routes); an address it cannot listen on is an error
    naming the keys that set it."""
    host, port, hooks = where["host"], where["port"], where.get("serve")
    limits = where.get("limits") or APIServerConfig()
    served = model.served_model(model_path)
    app = build_app(served, hooks, limits, where.get("api_key"))
    try:
        return RunningServer(app, host, port, limits.read_timeout)
    except OSError as exc:
        keys = (
            "explorer.listen_address/proxy_port"
            if hooks is not None
            else "explorer.rollout_model.openai_api_host/openai_api_port"
        )
        raise OSError(
            f"{keys}: cannot listen on {host}:{port} ({exc.strerror}); use a free port, or 0 "
            "for any free one"
        ) from exc


def served_at(model_path: str, url: str, api_key: Optional[Secret]) -> Dict[str, Any]:
    """What an engine host's ``api_address`` answers: ``{"url", "model", "api_key"}``, the
    key (a ``Secret``, or None) for the project's own clients; logged without the key."""
    required = " (API key required)" if api_key is not None else ""
    logger.info("OpenAI-compatible API of %s at %s/v1%s", model_path, url, required)
    return {"url": url, "model": model_path, "api_key": api_key}
