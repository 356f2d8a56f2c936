"""``stream: true`` and replies kept on the server (``RECORD_HEADER``), over real HTTP.

A streamed reply is the same reply as the unstreamed one of the same seed, in OpenAI's chunk
shapes, read back by the ``openai`` package's own stream parser; records are the engine's
exact tokens, taken once.
"""

import asyncio
import logging
from typing import Any

import httpx
import pytest

from tests.unit.test_openai_server import ADD_TOOL, USER, LocalServer, _scripted, make_engine
from trinity.common.models.model import ModelWrapper
from trinity.common.models.reply_tokens import TOKENS_HEADER
from trinity.engine.records import RecordStore


@pytest.fixture(scope="module")
def local(micro_model):
    host = LocalServer(make_engine(micro_model), micro_model)
    yield host
    host.close()


@pytest.fixture(scope="module")
def client(local):
    return local.client()


def _chat(client: Any, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        **{"model": client.model_path, "messages": USER, "max_tokens": 6, **kwargs}
    )


def test_a_streamed_chat_is_the_unstreamed_reply_in_chunks(client):
    whole = _chat(client, n=2, seed=7, logprobs=True)
    chunks = list(
        _chat(
            client, n=2, seed=7, logprobs=True, stream=True, stream_options={"include_usage": True}
        )
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert mine[0].delta.role == "assistant"
        assert [c.finish_reason for c in mine] == [None, choice.finish_reason]
        streamed_lps = [t.logprob for c in mine if c.logprobs for t in c.logprobs.content]
        assert streamed_lps == [t.logprob for t in choice.logprobs.content]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    without = list(_chat(client, seed=7, stream=True))
    assert all(c.usage is None for c in without) and without[-1].choices[0].finish_reason


def test_streamed_tool_calls_arrive_as_deltas():
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    scripted = _scripted(text)
    try:
        client = scripted.client()
        chunks = list(_chat(client, tools=[ADD_TOOL], stream=True))
    finally:
        scripted.close()
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Sure."
    calls = [t for d in deltas for t in (d.tool_calls or [])]
    assert [(t.index, t.type, t.function.name, t.function.arguments) for t in calls] == [
        (0, "function", "add", '{"a": 1}')
    ]
    assert calls[0].id
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_streamed_completion_is_the_unstreamed_text(client):
    whole = client.completions.create(model=client.model_path, prompt="ab", max_tokens=5, seed=3)
    chunks = list(
        client.completions.create(
            model=client.model_path, prompt="ab", max_tokens=5, seed=3, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_replies_kept_under_a_record_key_are_the_engines_tokens_taken_once(local):
    wrapper = ModelWrapper(local, enable_history=True)
    where = wrapper.endpoint(record_key="episode-1")
    assert where["base_url"] == f"{local.server.url}/v1" and where["api_key"] is None
    headers = {**where["headers"], TOKENS_HEADER: "1"}
    with httpx.Client(base_url=where["base_url"], headers=headers) as http:
        first = http.post("/chat/completions", json=_body(where, seed=1, n=2)).json()
        streamed = http.post("/chat/completions", json=_body(where, seed=2, stream=True))
        assert streamed.text.endswith("data: [DONE]\n\n")
    taken = asyncio.run(wrapper.take_recorded("episode-1"))
    sampled = [c["trinity"]["token_ids"] for c in first["choices"]]
    prompt = first["trinity"]["prompts"][0]["token_ids"]
    assert [e.tokens[: e.prompt_length].tolist() for e in taken] == [prompt] * 3
    assert [e.tokens[e.prompt_length :].tolist() for e in taken[:2]] == sampled
    assert [e.logprobs.tolist() for e in taken[:2]] == [
        c["trinity"]["logprobs"] for c in first["choices"]
    ]
    assert wrapper.extract_experience_from_history() == taken
    assert asyncio.run(wrapper.take_recorded("episode-1")) == []  # taken once
    assert asyncio.run(wrapper.take_recorded("never-used")) == []


def _body(where: dict, **kwargs: Any) -> dict:
    return {"model": where["model"], "messages": USER, "max_tokens": 4, **kwargs}


def test_a_request_without_a_record_key_keeps_nothing(local, client):
    _chat(client, seed=3)
    with httpx.Client(base_url=local.server.url) as http:
        kept = http.post("/trinity/records/take", json={"key": ""}).json()
        bad = http.post("/trinity/records/take", json={"key": 5})
    assert kept == {"replies": []}
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "key"


def test_the_store_drops_the_oldest_key_beyond_its_bound(caplog):
    store = RecordStore(max_keys=2)
    for key in ("a", "b", "a"):  # "a" used again after "b": "b" is now the oldest
        store.add(key, {"choices": [key]})
    with caplog.at_level(logging.WARNING, logger="trinity.engine.records"):
        store.add("c", {"choices": ["c"]})
    assert "recorded replies of key b dropped untaken (1 replies)" in caplog.text
    assert store.take("b") == []
    assert store.take("a") == [{"choices": ["a"]}, {"choices": ["a"]}]
    assert store.take("c") == [{"choices": ["c"]}]
