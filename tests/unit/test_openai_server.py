"""The OpenAI-compatible server over the embedded engine, driven by the real ``openai`` client.

The engine and its server run on an event loop in a thread, as an engine actor hosts them
(``LocalServer``); requests travel over real HTTP on 127.0.0.1.
"""

import asyncio
import json
import socket
import threading
from typing import Any, Dict, List

import openai
import pytest

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.common.experience import Experience
from trinity.common.models.client import openai_client
from trinity.common.models.sampling import SamplingParams
from trinity.engine.server import RunningServer, ServedModel, build_app
from trinity.engine.tool_calls import arguments_as_objects, parse_tool_calls
from trinity.engine.transformers_model import TransformersInferenceModel
from trinity.utils.loop_host import LoopHost

from .joins import record_joins

# Hermes-style: tools listed in a system turn, calls written as <tool_call>{json}</tool_call>.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>"
    "{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}</tools><|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for call in m.tool_calls or [] %}<tool_call>"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "</tool_call>{%- endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MAX_MODEL_LEN = 256  # the micro model's positions
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "1+1="}]


class LocalServer:
    """A model and its server on an event loop in a thread; its methods are the engine
    interface ``ModelWrapper`` calls, run on that loop (as an engine actor runs them)."""

    def __init__(self, model: Any, name: str, served: Any = None, limits: Any = None) -> None:
        """``limits``: an ``APIServerConfig`` (unset: the defaults)."""
        self.model, self.name = model, name
        self.host = LoopHost(lambda: None, f"server-{name}")
        self.loop = self.host.loop
        served = served or ServedModel.from_transformers(model, name)
        self.server = self.run(self._start(served, limits or APIServerConfig()))

    async def _start(self, served: ServedModel, limits: APIServerConfig) -> RunningServer:
        return RunningServer(build_app(served, limits=limits), read_timeout=limits.read_timeout)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    async def _on_loop(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def chat(self, messages: Any, params: Any, tools: Any = None, session: Any = None) -> Any:
        return self._on_loop(self.model.chat(messages, params, tools, session))

    def generate(self, *args: Any) -> Any:
        return self._on_loop(self.model.generate(*args))

    def prompt_length(self, messages: Any, tools: Any = None, session: Any = None) -> Any:
        return self._on_loop(self.model.prompt_length(messages, tools, session))

    def model_version(self) -> Any:
        return self._on_loop(self.model.model_version())

    def api_address(self) -> Dict[str, str]:
        return {"url": self.server.url, "model": self.name}

    def client(self, **kwargs: Any) -> openai.OpenAI:
        return openai_client(self.server.url, self.name, **kwargs)

    def close(self) -> None:
        """Stop the server, then cancel what else runs on the loop (the model's batching)."""
        self.run(self.server.close())
        self.host.close()


def make_engine(micro_model: str, **kwargs: Any) -> TransformersInferenceModel:
    return TransformersInferenceModel(
        model_path=micro_model,
        max_model_len=MAX_MODEL_LEN,
        max_prompt_tokens=None,
        max_response_tokens=8,
        **{"chat_template": HERMES_TEMPLATE, "enable_auto_tool_choice": True, **kwargs},
    )


@pytest.fixture(scope="module")
def local(micro_model):
    host = LocalServer(make_engine(micro_model), micro_model)
    yield host
    host.close()


@pytest.fixture(scope="module")
def client(local):
    return local.client()


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        **{"model": client.model_path, "messages": USER, "max_tokens": 6, **kwargs}
    )


def test_models_lists_the_model_path_and_accepts_its_basename(local, client, micro_model):
    assert [m.id for m in client.models.list().data] == [micro_model]
    assert client.model_path == micro_model
    reply = _chat(client, model="micro")  # the folder's basename is an alias
    assert reply.model == micro_model and reply.object == "chat.completion"


def test_chat_returns_the_engines_own_samples_and_logprobs(local, client):
    reply = _chat(client, n=3, seed=11, logprobs=True, top_logprobs=3)
    params = SamplingParams(n=3, seed=11, max_tokens=6, min_tokens=0, top_logprobs=3)
    direct = asyncio.run(local.chat(USER, params))
    assert len(reply.choices) == 3 and [c.index for c in reply.choices] == [0, 1, 2]
    for choice, exp in zip(reply.choices, direct, strict=True):
        assert choice.message.content == exp.response_text
        tokens = choice.logprobs.content
        assert [t.logprob for t in tokens] == exp.logprobs.tolist()
        sampled = exp.tokens[exp.prompt_length :].tolist()
        decode = local.model.tokenizer.decode
        assert [t.token for t in tokens] == [decode([i]) for i in sampled]
        for step, token in zip(exp.info["top_logprobs"], tokens, strict=True):
            assert [a.logprob for a in token.top_logprobs] == [lp for _, lp in step]
            assert len(token.top_logprobs) == 3
        assert choice.finish_reason == exp.info["finish_reason"]
    assert reply.usage.prompt_tokens == direct[0].prompt_length
    assert reply.usage.completion_tokens == sum(e.response_length for e in direct)


def test_completions_take_text_and_token_prompts(local, client):
    ids = local.model.tokenizer.encode("12+3=", add_special_tokens=False)
    reply = client.completions.create(
        model=client.model_path, prompt=ids, max_tokens=5, n=2, logprobs=2, seed=3
    )
    direct = asyncio.run(
        local.generate("12+3=", SamplingParams(n=2, max_tokens=5, min_tokens=0, seed=3))
    )
    assert [c.text for c in reply.choices] == [e.response_text for e in direct]
    first = reply.choices[0].logprobs
    assert first.token_logprobs == direct[0].logprobs.tolist()
    assert len(first.tokens) == len(first.top_logprobs) == direct[0].response_length
    assert all(len(alternatives) <= 2 for alternatives in first.top_logprobs)
    assert first.text_offset[0] == 0
    two = client.completions.create(model=client.model_path, prompt=["ab", "abc"], max_tokens=3)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage.prompt_tokens == 5 and two.choices[0].logprobs is None


def test_seed_makes_samples_reproducible(client):
    def texts(seed: int) -> List[str]:
        reply = _chat(client, n=3, seed=seed, max_tokens=8)
        return [c.message.content for c in reply.choices]

    assert texts(5) == texts(5)
    assert texts(5) != texts(6)


def test_stop_string_ends_the_reply_before_it(client):
    seed, text = 0, ""
    while len(text) < 4:  # a seed whose reply is long enough to stop inside
        seed += 1
        text = _chat(client, seed=seed, max_tokens=8).choices[0].message.content
    stop = text[3]
    reply = _chat(client, seed=seed, max_tokens=8, stop=stop)
    assert reply.choices[0].message.content == text[: text.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].model_extra["stop_reason"] == stop


def test_max_tokens_defaults_to_the_room_left_in_max_model_len(client):
    # min_tokens (an extra field) keeps eos away, so the reply runs to the limit.
    reply = _chat(client, max_tokens=None, extra_body={"min_tokens": MAX_MODEL_LEN, "top_k": 5})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.total_tokens == MAX_MODEL_LEN


def _error(call: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value


def test_errors_are_openai_shaped_with_the_reason(client):
    too_long = _error(lambda: _chat(client, messages=[{"role": "user", "content": "9" * 300}]))
    assert too_long.status_code == 400 and too_long.code == "context_length_exceeded"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in too_long.message
    assert too_long.body["param"] == "messages"
    unknown = _error(lambda: _chat(client, model="gpt-4o"))
    assert isinstance(unknown, openai.NotFoundError) and unknown.code == "model_not_found"
    cases = {
        "top_p": dict(top_p=2.0),
        "max_tokens": dict(max_tokens=MAX_MODEL_LEN),
        "n": dict(n=0),
        "top_logprobs": dict(logprobs=True, top_logprobs=21),
        "tool_choice": dict(tools=[ADD_TOOL], tool_choice="required"),
        "presence_penalty": dict(presence_penalty=0.5),
    }
    for param, kwargs in cases.items():
        error = _error(lambda kwargs=kwargs: _chat(client, **kwargs))
        assert isinstance(error, openai.BadRequestError), param
        assert error.body["param"] == param and error.body["type"] == "invalid_request_error"
    assert "not supported yet" in _error(lambda: _chat(client, presence_penalty=0.5)).message
    typed = _error(lambda: _chat(client, extra_body={"n": "many"}))
    assert typed.status_code == 400 and typed.body["param"] == "n"
    ids = _error(lambda: client.completions.create(model=client.model_path, prompt=[10**6]))
    assert ids.status_code == 400 and "token ids outside" in ids.message


def test_tools_reach_the_chat_template(local):
    recorded: List[Experience] = []
    recording = local.client(record=recorded.extend)
    _chat(recording, tools=[ADD_TOOL])
    assert '<tools>{"type": "function", "function": {"name": "add"' in recorded[0].prompt_text
    # A reply with tool calls and the tool's result render as the template writes them.
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]
    _chat(recording, messages=history, tools=[ADD_TOOL])
    prompt = recorded[1].prompt_text
    assert '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' in prompt
    assert "<|im_start|>tool\n2<|im_end|>" in prompt


class ScriptedModel:
    """An engine whose reply text is given: the server's parsing seen end to end."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def generate_ids(self, prompt_ids: List[int], params: SamplingParams) -> list:
        return [
            Experience(
                tokens=prompt_ids + [5, 6],
                prompt_length=len(prompt_ids),
                logprobs=[-0.5, -0.25],
                prompt_text="p",
                response_text=self.text,
                info={"finish_reason": "stop"},
            )
            for _ in range(params.n)
        ]


def served_by(model: Any, limits: Any = None, **parsers: Any) -> LocalServer:
    """A server over an engine stand-in with ``generate_ids`` (``parsers``: ServedModel's
    ``reasoning_parser`` / ``tool_call_parser`` / ``enable_auto_tool_choice``; ``limits``:
    an ``APIServerConfig``)."""
    served = ServedModel(
        model=model,
        name="scripted",
        max_model_len=MAX_MODEL_LEN,
        vocab_size=100,
        chat_ids=lambda messages, tools: [1, 2, 3],
        text_ids=lambda prompt: [1, 2, 3],
        decode=lambda ids: "x",
        **parsers,
    )
    return LocalServer(None, "scripted", served, limits)


def _scripted(text: str, **parsers: Any) -> LocalServer:
    """A server whose model always replies ``text`` (``enable_auto_tool_choice`` on unless
    given)."""
    return served_by(ScriptedModel(text), **{"enable_auto_tool_choice": True, **parsers})


def test_tool_calls_in_the_reply_are_parsed(local):
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    scripted = _scripted(text)
    try:
        client = scripted.client()
        reply = _chat(client, tools=[ADD_TOOL])
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Sure."
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "add"
        assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
        assert _chat(client).choices[0].message.content == text  # no tools: no parsing
        none = _chat(client, tools=[ADD_TOOL], tool_choice="none").choices[0]
        assert none.message.tool_calls is None and none.finish_reason == "stop"
    finally:
        scripted.close()


def test_without_enable_auto_tool_choice_auto_is_refused_as_vllm_refuses_it(micro_model):
    text = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    scripted = _scripted(text, enable_auto_tool_choice=False)
    try:
        client = scripted.client()
        for kwargs in (dict(tools=[ADD_TOOL]), dict(tools=[ADD_TOOL], tool_choice="auto")):
            error = _error(lambda kwargs=kwargs: _chat(client, **kwargs))
            assert isinstance(error, openai.BadRequestError)
            assert error.body["param"] == "tool_choice"
            assert "enable_auto_tool_choice: true" in error.message
        # "none" samples as usual and returns the text whole; no tools, no tool choice
        none = _chat(client, tools=[ADD_TOOL], tool_choice="none").choices[0].message
        assert none.content == text and none.tool_calls is None
        assert _chat(client).choices[0].message.content == text
        # whatever the flag: required and named choices (vLLM: structured outputs), a choice
        # without tools, and a value that is no choice
        named = {"type": "function", "function": {"name": "add"}}
        for choice, words in (
            ("required", "not supported yet"),
            (named, "not supported yet"),
            ("sometimes", "invalid tool_choice"),
        ):
            error = _error(lambda c=choice: _chat(client, tools=[ADD_TOOL], tool_choice=c))
            assert error.status_code == 400 and words in error.message
        error = _error(lambda: _chat(client, tool_choice="auto"))
        assert error.status_code == 400 and "tools must be set" in error.message
    finally:
        scripted.close()
    off = make_engine(micro_model, enable_auto_tool_choice=False, num_threads=1)
    assert ServedModel.from_transformers(off, "m").enable_auto_tool_choice is False
    assert ServedModel.from_transformers(make_engine(micro_model), "m").enable_auto_tool_choice


def test_parse_tool_calls_on_text():
    only = '<tool_call>{"name": "f", "arguments": {"x": [1, 2]}}</tool_call>'
    content, calls = parse_tool_calls(only)
    assert content is None and len(calls) == 1
    assert calls[0]["function"] == {"name": "f", "arguments": '{"x": [1, 2]}'}
    assert calls[0]["id"].startswith("call_")
    two = f'a {only} b <tool_call>{{"name": "g", "arguments": "{{}}"}}</tool_call>'
    content, calls = parse_tool_calls(two)
    assert content == "a  b"
    assert [c["function"]["name"] for c in calls] == ["f", "g"]
    assert calls[1]["function"]["arguments"] == "{}"  # a string is passed through
    for broken in ("<tool_call>{not json}</tool_call>", '<tool_call>{"a": 1}</tool_call>', "x"):
        assert parse_tool_calls(broken) == (broken, [])
    cut = '<tool_call>{"name": "f"'  # cut off by max_tokens: no closing tag
    assert parse_tool_calls(cut) == (cut, [])


def test_tool_call_arguments_are_parsed_for_the_template():
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    bad = {"id": "2", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    messages = [{"role": "assistant", "content": None, "tool_calls": [call, bad]}]
    out = arguments_as_objects(messages)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert out[0]["tool_calls"][1]["function"]["arguments"] == "{oops"
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # untouched


def test_the_server_listens_on_loopback_only(local):
    assert local.server.host == "127.0.0.1"
    assert local.server.socket.getsockname()[0] == "127.0.0.1"
    import psutil

    others = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    for address in others:  # reachable on loopback, refused on every other interface
        with pytest.raises(OSError):
            socket.create_connection((address, local.server.port), timeout=5).close()
    socket.create_connection(("127.0.0.1", local.server.port), timeout=5).close()


def test_concurrent_clients_and_direct_calls_share_engine_batches(micro_model):
    # A generous gathering window: on a loaded machine the threads still land together.
    model = make_engine(micro_model, batch_wait_s=5.0, batch_idle_s=1.0)
    batches = record_joins(model.engine)  # the prompts that joined the decode loop at a step
    host = LocalServer(model, micro_model)
    try:
        client = host.client()
        start = threading.Barrier(6)
        direct_messages = [{"role": "user", "content": "7*7="}]

        def over_http(i: int) -> None:
            start.wait()
            _chat(client, messages=[{"role": "user", "content": f"{i}+{i}="}], max_tokens=4)

        def direct() -> None:
            start.wait()
            asyncio.run(host.chat(direct_messages, SamplingParams(max_tokens=4)))

        threads = [threading.Thread(target=over_http, args=(i,)) for i in range(4)]
        threads += [threading.Thread(target=direct) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        host.close()
    assert sum(len(b) for b in batches) == 6
    assert len(batches) < 6
    direct_ids = model.engine.apply_chat_template(direct_messages)
    # Some step took requests of both kinds: HTTP requests join direct calls' batches.
    assert any(direct_ids in b and len(b) > b.count(direct_ids) for b in batches)


def test_a_reasoning_parser_moves_the_think_block_to_reasoning_content():
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    text = f"<think>\nOne plus two.\n</think>\n\nIt is 3. {call}"
    for parser in ("qwen3", "deepseek_r1"):
        scripted = _scripted(text, reasoning_parser=parser, enable_thinking=True)
        try:
            message = _chat(scripted.client(), tools=[ADD_TOOL]).choices[0].message
            # the openai package keeps fields it does not declare in model_extra
            assert message.model_extra["reasoning_content"] == "One plus two."
            assert message.content == "It is 3."
            assert message.tool_calls[0].function.name == "add"  # parsed from the answer
        finally:
            scripted.close()
    plain = _scripted(text)  # no parser: the reply as written, no reasoning_content
    try:
        message = _chat(plain.client()).choices[0].message
        assert message.content == text and "reasoning_content" not in (message.model_extra or {})
    finally:
        plain.close()


def test_the_served_model_takes_the_engines_reasoning_parser(micro_model):
    model = make_engine(micro_model, reasoning_parser="qwen3", enable_thinking=True, num_threads=1)
    served = ServedModel.from_transformers(model, micro_model)
    assert (served.reasoning_parser, served.enable_thinking) == ("qwen3", True)
    assert ServedModel.from_transformers(make_engine(micro_model), "m").reasoning_parser is None


TOOL_CALL_FORMATS = {
    "hermes": 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2]}}\n</tool_call>',
    "llama3_json": '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": [2]}}',
    "mistral": 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": [2]}}]',
    "qwen3_coder": "Sure.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"
    "<parameter=b>\n[2]\n</parameter>\n</function>\n</tool_call>",
}


@pytest.mark.parametrize("parser", sorted(TOOL_CALL_FORMATS))
def test_each_tool_call_format_reaches_the_openai_client(parser):
    scripted = _scripted(TOOL_CALL_FORMATS[parser], tool_call_parser=parser)
    try:
        choice = _chat(scripted.client(), tools=[ADD_TOOL]).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == (None if parser == "llama3_json" else "Sure.")
        (call,) = choice.message.tool_calls
        assert call.function.name == "add"
        assert json.loads(call.function.arguments) == {"a": 1, "b": [2]}
    finally:
        scripted.close()


def test_every_parser_keeps_a_malformed_reply_whole():
    from trinity.engine.tool_calls import TOOL_CALL_PARSERS

    broken = {
        "hermes": "<tool_call>{not json}</tool_call>",
        "llama3_json": '{"name": "add", "parameters": {"a": 1}',  # cut off
        "mistral": '[TOOL_CALLS][{"name": "add", "argu',
        "qwen3_coder": "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n",
    }
    assert set(broken) == set(TOOL_CALL_PARSERS)
    for parser, text in broken.items():
        assert parse_tool_calls(text, parser) == (text, []), parser
    for parser in TOOL_CALL_PARSERS:  # plain prose is content in every format
        assert parse_tool_calls("It is 3.", parser) == ("It is 3.", [])
    two = '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": 1}}'
    assert [c["function"]["name"] for c in parse_tool_calls(two, "llama3_json")[1]] == ["f", "g"]
    from typing import get_args

    from trinity.common.config.schema_explorer import InferenceModelConfig

    annotation = InferenceModelConfig.model_fields["tool_call_parser"].annotation
    assert set(get_args(annotation)) == set(TOOL_CALL_PARSERS)
