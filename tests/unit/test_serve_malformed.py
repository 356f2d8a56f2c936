"""Malformed requests against mode serve's endpoint (design decision 19): each one of the
corpus gets a 4xx with an OpenAI-style error naming the field at fault (``param``), the
server keeps answering, and nothing already recorded changes; commits race and repeat."""

import json
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from tests.unit.serve_endpoint import Endpoint, serve_endpoint

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
DEEP = b"[" * 100_000 + b"]" * 100_000  # nested past what Python's JSON reader can read
TEN_MB = "x" * 10_000_000


@dataclass
class Bad:
    """A bad request, and what its error must say: ``status``, ``param`` (None: the body as
    a whole), and a fragment of the message."""

    label: str
    path: str
    body: Any
    status: int
    param: Optional[str]
    says: str = ""
    method: str = "POST"


def _chat(name: str, **fields: Any) -> Dict[str, Any]:
    body = {"model": name, "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 4}
    return {k: v for k, v in {**body, **fields}.items() if v is not ...}


def _message(**fields: Any) -> List[Dict[str, Any]]:
    return [{k: v for k, v in {"role": "user", "content": "hi", **fields}.items() if v is not ...}]


def _tool(**function: Any) -> List[Dict[str, Any]]:
    spec = {k: v for k, v in {"name": "f", **function}.items() if v is not ...}
    return [{"type": "function", "function": spec}]


def chat_corpus(model: str) -> List[Bad]:
    """The body, the model, the messages."""
    c = lambda **f: _chat(model, **f)  # noqa: E731
    return [
        Bad("not JSON", CHAT, b"{not json", 400, None, "JSON"),
        Bad("invalid UTF-8", CHAT, b'{"model": "\xff\xfe"}', 400, None, "body"),
        Bad("an array", CHAT, b"[1, 2]", 400, None, "body"),
        Bad("a string", CHAT, b'"hello"', 400, None, "body"),
        Bad("null", CHAT, b"null", 400, None, "body"),
        Bad("nested too deep", CHAT, DEEP, 400, None, "body"),
        Bad("no model", CHAT, c(model=...), 400, "model", "required"),
        Bad("model a number", CHAT, c(model=123), 400, "model", "string"),
        Bad("another model", CHAT, c(model="gpt-4"), 404, "model", "gpt-4"),
        Bad("no messages", CHAT, c(messages=...), 400, "messages", "required"),
        Bad("messages a string", CHAT, c(messages="hi"), 400, "messages", "list"),
        Bad("no message", CHAT, c(messages=[]), 400, "messages", "at least one"),
        Bad("a message a string", CHAT, c(messages=["hi"]), 400, "messages[0]", "dictionary"),
        Bad("no role", CHAT, c(messages=_message(role=...)), 400, "messages[0].role"),
        Bad("unknown role", CHAT, c(messages=_message(role="wizard")), 400, "messages[0].role"),
        Bad("role a number", CHAT, c(messages=_message(role=5)), 400, "messages[0].role"),
        Bad(
            "content a number", CHAT, c(messages=_message(content=123)), 400, "messages[0].content"
        ),
        Bad(
            "content an object", CHAT, c(messages=_message(content={})), 400, "messages[0].content"
        ),
        Bad(
            "an image part",
            CHAT,
            c(messages=_message(content=[{"type": "image_url", "image_url": {"url": "x"}}])),
            400,
            "messages[0].content",
            "only text parts",
        ),
        Bad(
            "a part without type",
            CHAT,
            c(messages=_message(content=[{"text": "x"}])),
            400,
            "messages[0].content[0].type",
        ),
        Bad(
            "tool_calls a string",
            CHAT,
            c(messages=_message(role="assistant", tool_calls="x")),
            400,
            "messages[0].tool_calls",
        ),
        Bad(
            "a tool call without name",
            CHAT,
            c(messages=_message(role="assistant", tool_calls=[{"function": {"arguments": "{}"}}])),
            400,
            "messages[0].tool_calls[0].function.name",
        ),
        Bad("a 10 MB message", CHAT, c(messages=_message(content=TEN_MB)), 413, None, "max_body"),
        Bad("1025 messages", CHAT, c(messages=_message() * 1025), 400, "messages", "max_messages"),
    ]


def chat_sampling_corpus(model: str) -> List[Bad]:
    c = lambda **f: _chat(model, **f)  # noqa: E731
    return [
        Bad("n negative", CHAT, c(n=-1), 400, "n"),
        Bad("n zero", CHAT, c(n=0), 400, "n"),
        Bad("n huge", CHAT, c(n=10**9), 400, "n", "max_n"),
        Bad("n a string", CHAT, c(n="3"), 400, "n"),
        Bad("n a bool", CHAT, c(n=True), 400, "n"),
        Bad("n a fraction", CHAT, c(n=1.5), 400, "n"),
        Bad("max_tokens negative", CHAT, c(max_tokens=-5), 400, "max_tokens"),
        Bad("max_tokens zero", CHAT, c(max_tokens=0), 400, "max_tokens"),
        Bad("max_tokens past the model", CHAT, c(max_tokens=10**12), 400, "max_tokens", "256"),
        Bad("max_tokens a string", CHAT, c(max_tokens="many"), 400, "max_tokens"),
        Bad(
            "max_tokens 1e400",
            CHAT,
            json.dumps(c()).replace('"max_tokens": 4', '"max_tokens": 1e400').encode(),
            400,
            "max_tokens",
        ),
        Bad(
            "max_completion_tokens negative",
            CHAT,
            c(max_completion_tokens=-1),
            400,
            "max_completion_tokens",
        ),
        Bad("temperature a string", CHAT, c(temperature="hot"), 400, "temperature"),
        Bad(
            "temperature NaN",
            CHAT,
            json.dumps(c(temperature=float("nan"))).encode(),
            400,
            "temperature",
        ),
        Bad("temperature other than the trainer's", CHAT, c(temperature=-1), 400, "temperature"),
        Bad("top_p over 1", CHAT, c(top_p=2), 400, "top_p"),
        Bad("top_p a string", CHAT, c(top_p="x"), 400, "top_p"),
        Bad("top_k a string", CHAT, c(top_k="x"), 400, "top_k"),
        Bad("top_k huge", CHAT, c(top_k=10**30), 400, "top_k"),
        Bad("seed huge", CHAT, c(seed=10**30), 400, "seed"),
        Bad("seed a string", CHAT, c(seed="s"), 400, "seed"),
        Bad("min_tokens negative", CHAT, c(min_tokens=-1), 400, "min_tokens"),
        Bad("stop a number", CHAT, c(stop=5), 400, "stop"),
        Bad("stop numbers", CHAT, c(stop=[1, 2]), 400, "stop[0]"),
        Bad("stop empty", CHAT, c(stop=[""]), 400, "stop"),
        Bad("100 stop strings", CHAT, c(stop=["a"] * 100), 400, "stop"),
        Bad("stop_token_ids negative", CHAT, c(stop_token_ids=[-1]), 400, "stop_token_ids"),
        Bad("stop_token_ids huge", CHAT, c(stop_token_ids=[10**9]), 400, "stop_token_ids"),
        Bad("stop_token_ids strings", CHAT, c(stop_token_ids=["a"]), 400, "stop_token_ids[0]"),
        Bad("logprobs a string", CHAT, c(logprobs="yes"), 400, "logprobs"),
        Bad("top_logprobs 100", CHAT, c(logprobs=True, top_logprobs=100), 400, "top_logprobs"),
        Bad("top_logprobs negative", CHAT, c(logprobs=True, top_logprobs=-1), 400, "top_logprobs"),
        Bad("stream a string", CHAT, c(stream="yes"), 400, "stream"),
        Bad(
            "stream_options.include_usage a string",
            CHAT,
            c(stream=True, stream_options={"include_usage": "yes"}),
            400,
            "stream_options.include_usage",
        ),
        Bad("presence_penalty a string", CHAT, c(presence_penalty="x"), 400, "presence_penalty"),
        Bad("logit_bias strings", CHAT, c(logit_bias={"1": "b"}), 400, "logit_bias.1"),
    ]


def chat_tool_corpus(model: str) -> List[Bad]:
    c = lambda **f: _chat(model, **f)  # noqa: E731
    return [
        Bad("tools a string", CHAT, c(tools="none"), 400, "tools"),
        Bad("a tool a string", CHAT, c(tools=["x"]), 400, "tools[0]"),
        Bad(
            "a tool schema not an object",
            CHAT,
            c(tools=_tool(parameters="not an object")),
            400,
            "tools[0].function.parameters",
        ),
        Bad(
            "a tool without function",
            CHAT,
            c(tools=[{"type": "function"}]),
            400,
            "tools[0].function",
        ),
        Bad(
            "a function without name", CHAT, c(tools=_tool(name=...)), 400, "tools[0].function.name"
        ),
        Bad("a tool of another type", CHAT, c(tools=[{"type": "retrieval"}]), 400, "tools[0].type"),
        Bad("tool_choice a number", CHAT, c(tool_choice=5), 400, "tool_choice"),
        Bad(
            "tool_choice unknown",
            CHAT,
            c(tools=_tool(), tool_choice="sometimes"),
            400,
            "tool_choice",
        ),
        Bad("response_format a string", CHAT, c(response_format="json"), 400, "response_format"),
        Bad("GET", CHAT, None, 405, None, "Method Not Allowed", method="GET"),
    ]


def completion_corpus(model: str) -> List[Bad]:
    def c(**fields: Any) -> Dict[str, Any]:
        body = {"model": model, "prompt": "1+1=", "max_tokens": 4, **fields}
        return {k: v for k, v in body.items() if v is not ...}

    return [
        Bad("no prompt", COMPLETIONS, c(prompt=...), 400, "prompt", "required"),
        Bad("prompt a number", COMPLETIONS, c(prompt=5), 400, "prompt"),
        Bad("prompt empty", COMPLETIONS, c(prompt=[]), 400, "prompt"),
        Bad("token id negative", COMPLETIONS, c(prompt=[[-1]]), 400, "prompt"),
        Bad("token id a fraction", COMPLETIONS, c(prompt=[1.5]), 400, "prompt[0]"),
        Bad("a prompt of no token", COMPLETIONS, c(prompt=[[]]), 400, "prompt", "empty"),
        Bad("100 prompts", COMPLETIONS, c(prompt=["a"] * 100), 400, "n", "max_n"),
        Bad("logprobs negative", COMPLETIONS, c(logprobs=-1), 400, "logprobs"),
        Bad("echo a string", COMPLETIONS, c(echo="x"), 400, "echo"),
        Bad("a 10 MB prompt", COMPLETIONS, c(prompt=TEN_MB), 413, None, "max_body"),
        Bad("POST /v1/models", "/v1/models", {}, 405, None),
        Bad("no such route", "/v1/nope", {}, 404, None),
    ]


def feedback_corpus(ids: Dict[str, str]) -> List[Bad]:
    fb = lambda **f: {"reward": 1.0, "msg_ids": [ids["open"]], **f}  # noqa: E731
    unknown = [f"chatcmpl-{i}" for i in range(50_000)]
    return [
        Bad("not JSON", "/feedback", b"{not json", 400, None, "JSON"),
        Bad("invalid UTF-8", "/feedback", b'{"reward": "\xff"}', 400, None, "JSON"),
        Bad("nested too deep", "/feedback", DEEP, 400, None, "JSON"),
        Bad("an array", "/feedback", [1], 400, None, "object"),
        Bad("no reward", "/feedback", {"msg_ids": [ids["open"]]}, 422, "reward"),
        Bad("reward a string", "/feedback", fb(reward="1"), 422, "reward"),
        Bad("reward a bool", "/feedback", fb(reward=True), 422, "reward"),
        Bad("reward NaN", "/feedback", json.dumps(fb(reward=float("nan"))).encode(), 422, "reward"),
        Bad("reward inf", "/feedback", json.dumps(fb(reward=float("inf"))).encode(), 422, "reward"),
        Bad("msg_ids empty", "/feedback", fb(msg_ids=[]), 422, "msg_ids"),
        Bad("msg_ids a string", "/feedback", fb(msg_ids=ids["open"]), 422, "msg_ids"),
        Bad("msg_ids numbers", "/feedback", fb(msg_ids=[1]), 422, "msg_ids"),
        Bad("an unknown reply", "/feedback", fb(msg_ids=["chatcmpl-nope"]), 404, "msg_ids"),
        Bad(
            "a known and an unknown reply",
            "/feedback",
            fb(msg_ids=[ids["open"], "chatcmpl-nope"]),
            404,
            "msg_ids",
        ),
        Bad(
            "50,000 unknown replies", "/feedback", fb(msg_ids=unknown), 404, "msg_ids", "49997 more"
        ),
        Bad(
            "a committed reply", "/feedback", fb(msg_ids=[ids["done"]]), 409, "msg_ids", "committed"
        ),
        Bad(
            "an open and a committed reply",
            "/feedback",
            fb(msg_ids=[ids["open"], ids["done"]]),
            409,
            "msg_ids",
        ),
        Bad("task_id an object", "/feedback", fb(task_id={}), 422, "task_id"),
        Bad("task_id a fraction", "/feedback", fb(task_id=1.5), 422, "task_id"),
        Bad("run_id a string", "/feedback", fb(run_id="x"), 422, "run_id"),
        Bad("not JSON", "/commit", b"{not", 400, None, "JSON"),
        Bad("task_id a list", "/commit", {"task_id": []}, 422, "task_id"),
        Bad("a committed task again", "/commit", {"task_id": "done"}, 409, "task_id", "nothing"),
        Bad("a task with no feedback", "/commit", {"task_id": "nobody"}, 409, "task_id"),
        Bad("PUT", "/feedback", None, 405, None, method="PUT"),
    ]


def recorded(endpoint: Endpoint) -> Dict[str, Any]:
    """What the run has recorded: the response table's rows, the buffer's steps, counts."""
    log = endpoint.queue.responses
    with log.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(log.table.select().order_by(log.table.c.id))]
    metrics = {k: v for k, v in endpoint.request("GET", "/metrics").items() if k != "headers"}
    assert metrics["rollout/total_experience_count"] == len(rows) == 6
    return {"rows": rows, "steps": endpoint.queue.last_step(), "metrics": metrics}


def _setup(endpoint: Endpoint) -> Dict[str, str]:
    """A committed reply (task "done"), a rewarded open one ("open"), an unrewarded one."""
    ids = {name: endpoint.chat(n=2).id for name in ("done", "open", "silent")}
    for name in ("done", "open"):
        given = endpoint.post("/feedback", {"reward": 0.5, "msg_ids": [ids[name]], "task_id": name})
        assert given["http"] == 200
    assert endpoint.post("/commit", {"task_id": "done"})["experiences"] == 2
    return ids


def _answered(endpoint: Endpoint, bad: Bad) -> List[str]:
    """What is wrong with the answer to ``bad`` (nothing: an empty list)."""
    raw = bad.body if isinstance(bad.body, bytes) else None
    reply = endpoint.request(bad.method, bad.path, bad.body if raw is None else None, raw)
    error = reply.get("error") or {}
    message = str(error.get("message"))
    wrong = [] if reply["http"] == bad.status else [f"status {reply['http']}"]
    wrong += [] if error.get("param") == bad.param else [f"param {error.get('param')!r}"]
    wrong += [] if bad.says in message and error.get("type") else [f"message {message!r}"]
    field = (bad.param or "").split("[")[0]
    wrong += [] if field in message else [f"message {message!r} does not name {field}"]
    if endpoint.request("GET", "/health")["http"] != 200:
        wrong.append("the server stopped answering")
    return wrong


def test_each_malformed_request_is_a_4xx_naming_its_field_and_changes_nothing(
    micro_model, tmp_path
):
    with serve_endpoint(micro_model, tmp_path) as endpoint:
        ids = _setup(endpoint)
        before = recorded(endpoint)
        model = endpoint.model()
        corpus = chat_corpus(model) + chat_sampling_corpus(model) + chat_tool_corpus(model)
        corpus += completion_corpus(model) + feedback_corpus(ids)
        assert len(corpus) == 107
        wrong = [f"{bad.label}: {why}" for bad in corpus for why in _answered(endpoint, bad)]
        assert not wrong, "\n".join(wrong)
        assert recorded(endpoint) == before
        assert endpoint.chat().choices  # and it still serves


def test_a_commit_counts_once_however_often_and_concurrently_it_is_sent(micro_model, tmp_path):
    with serve_endpoint(micro_model, tmp_path) as endpoint:
        replies = [endpoint.chat().id for _ in range(4)]
        given = endpoint.post("/feedback", {"reward": 1.0, "msg_ids": replies, "task_id": "race"})
        assert given["updated"] == 4
        answers: List[Dict[str, Any]] = []
        barrier = threading.Barrier(8)

        def commit() -> None:
            barrier.wait()
            answers.append(endpoint.post("/commit", {"task_id": "race"}))

        threads = [threading.Thread(target=commit) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        statuses = sorted(a["http"] for a in answers)
        assert statuses == [200] + [409] * 7
        (won,) = [a for a in answers if a["http"] == 200]
        assert (won["step"], won["experiences"]) == (1, 4)
        assert all(a["error"]["code"] == "empty_commit" for a in answers if a["http"] == 409)
        again = endpoint.post("/commit", {"task_id": "race"})
        assert again["http"] == 409 and again["error"]["param"] == "task_id"
        assert endpoint.queue.last_step() == 1
        assert len(endpoint.queue.get(8, timeout=0).experiences) == 4  # written once
