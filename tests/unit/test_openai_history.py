"""``ModelWrapper``'s OpenAI clients and recorded history (``enable_history``).

The engine and its server run as an engine actor hosts them (``LocalServer``); the wrapper
talks to the engine directly and, through its clients, over HTTP.
"""

import asyncio
import threading
from typing import Any, List

import pytest

from tests.unit.test_openai_server import USER, LocalServer, make_engine
from trinity.common.config import ConfigError, load_config
from trinity.common.experience import Experience
from trinity.common.models.model import ModelWrapper
from trinity.common.models.sampling import SamplingParams
from trinity.common.workflows import Task, Workflow
from trinity.explorer.runner import WorkflowRunner
from trinity.preflight.derive import finalize


@pytest.fixture(scope="module")
def local(micro_model):
    host = LocalServer(make_engine(micro_model), micro_model)
    yield host
    host.close()


def wrapper(local: LocalServer, history: bool = True) -> ModelWrapper:
    return ModelWrapper(local, {"max_tokens": 4, "min_tokens": 0}, enable_history=history)


def test_every_call_is_recorded_in_order_token_exact(local):
    model = wrapper(local)
    client = model.get_openai_client()
    assert client is model.get_openai_client()  # one client per wrapper
    calls: List[tuple] = []  # (kind, experiences the caller saw or expects)

    calls.append(("chat", model.chat(USER, n=2, seed=1)))
    reply = client.chat.completions.create(
        model=client.model_path, messages=USER, n=2, max_tokens=4, seed=2, logprobs=True
    )
    calls.append(("http chat", reply))
    completion = client.completions.create(model=client.model_path, prompt="ab", max_tokens=3)
    calls.append(("http completion", completion))
    calls.append(("generate", model.generate(["xy", "z"], seed=3)))

    async def both_async() -> Any:
        first = await model.chat_async(USER, seed=4)
        aclient = model.get_openai_async_client()
        second = await aclient.chat.completions.create(
            model=aclient.model_path, messages=USER, max_tokens=4
        )
        return first, second

    first, second = asyncio.run(both_async())
    calls += [("chat", first), ("http chat", second)]

    recorded = model.extract_experience_from_history()
    assert model.extract_experience_from_history() == []  # extracting clears the record
    expected_texts = []
    for kind, seen in calls:
        if kind == "http chat":
            expected_texts += [c.message.content for c in seen.choices]
        elif kind == "http completion":
            expected_texts += [c.text for c in seen.choices]
        else:
            expected_texts += [e.response_text for e in seen]
    assert [e.response_text for e in recorded] == expected_texts
    # Direct calls are recorded as the very objects returned.
    assert recorded[:2] == calls[0][1] and recorded[7:8] == first
    # Calls over HTTP: the engine's prompt ids and sampled ids, and the logprobs it reported.
    prompt_ids = local.model.engine.apply_chat_template(USER)
    for exp, choice in zip(recorded[2:4], reply.choices, strict=True):
        assert exp.tokens[: exp.prompt_length].tolist() == prompt_ids
        assert exp.logprobs.tolist() == [t.logprob for t in choice.logprobs.content]
        assert exp.info["finish_reason"] == choice.finish_reason
    again = asyncio.run(
        local.chat(USER, SamplingParams(n=2, max_tokens=4, min_tokens=0, seed=2))
    )  # the same request straight to the engine: the same tokens
    assert [e.tokens.tolist() for e in recorded[2:4]] == [e.tokens.tolist() for e in again]
    completion_exp = recorded[4]
    assert completion_exp.prompt_text == "ab" and completion_exp.prompt_length == 2


def test_extract_can_keep_the_record(local):
    model = wrapper(local)
    model.chat(USER)
    assert len(model.extract_experience_from_history(clear_history=False)) == 1
    model.clear_history()
    assert model.extract_experience_from_history() == []


def test_without_history_nothing_is_recorded_or_sent(local):
    model = wrapper(local, history=False)
    client = model.get_openai_client()
    reply = client.chat.completions.create(model=client.model_path, messages=USER, max_tokens=2)
    assert "trinity" not in (reply.model_extra or {})  # no token data asked for
    with pytest.raises(ValueError, match=r"explorer\.rollout_model\.enable_history: true"):
        model.extract_experience_from_history()


def test_a_client_without_the_api_names_the_key(micro_model, local):
    class NoServer:
        def api_address(self) -> None:
            return None

    for engine in (make_engine(micro_model), NoServer()):
        model = ModelWrapper(engine)
        with pytest.raises(ValueError, match=r"explorer\.rollout_model\.enable_openai_api"):
            model.get_openai_client()
        with pytest.raises(ValueError, match=r"explorer\.rollout_model\.enable_openai_api"):
            model.get_openai_async_client()


def test_forks_record_apart_and_share_version_tracking(local):
    parent = wrapper(local)
    a, b = parent.fork(), parent.fork()
    client = b.get_openai_client()
    with parent.track_versions() as seen:
        a.chat(USER)
        client.chat.completions.create(model=client.model_path, messages=USER, max_tokens=2)
    assert seen == [0, 0]  # the weights behind each reply, over HTTP too (from its record)
    assert len(a.extract_experience_from_history()) == 1
    assert len(b.extract_experience_from_history()) == 1
    assert parent.extract_experience_from_history() == []


class Episode(Workflow):
    """Chats ``workflow_args.calls`` times; extracts its record only if asked to."""

    def run(self) -> List[Experience]:
        args = self.task.workflow_args
        args["started"].wait(timeout=30)  # both tasks are in flight at once
        client = self.model.get_openai_client()
        for i in range(args["calls"]):
            content = f"{self.task.task_id} {i}"
            client.chat.completions.create(
                model=client.model_path,
                messages=[{"role": "user", "content": content}],
                max_tokens=2,
            )
        if not args["extract"]:
            return [Experience(tokens=[1, 2], prompt_length=1)]
        return self.model.extract_experience_from_history()

    def resettable(self) -> bool:
        return True

    def reset(self, task: Task) -> None:
        self.task = task


def test_runner_keeps_each_tasks_record_apart(local):
    runner = WorkflowRunner(local, {"max_tokens": 2}, max_retry_times=0, enable_history=True)
    started = threading.Barrier(2)
    tasks = [
        Task(
            workflow=Episode,
            task_id=name,
            workflow_args={"calls": calls, "extract": True, "started": started},
        )
        for name, calls in (("a", 2), ("b", 3))
    ]
    results: dict = {}
    threads = [
        threading.Thread(target=lambda t=t: results.update({t.task_id: runner.run_task(t)}))
        for t in tasks
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for name, calls in (("a", 2), ("b", 3)):
        exps = results[name].experiences
        assert results[name].error is None and len(exps) == calls
        assert all(f"user\n{name} " in e.prompt_text for e in exps)
    # A reused workflow starts its next task with an empty record.
    lone = threading.Barrier(1)
    left = Task(
        workflow=Episode,
        task_id="c",
        workflow_args={"calls": 2, "extract": False, "started": lone},
    )
    assert runner.run_task(left).error is None
    after = Task(
        workflow=Episode, task_id="d", workflow_args={"calls": 1, "extract": True, "started": lone}
    )
    (only,) = runner.run_task(after).experiences
    assert "user\nd 0" in only.prompt_text


CONFIG = """
model: {model_path: /models/tiny, max_prompt_tokens: 40, max_response_tokens: 8}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {name: train, path: /data}
    default_workflow_type: math_workflow
"""


def _config_problems(tmp_path, overrides: List[str]) -> List[str]:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    try:
        finalize(load_config(str(path), overrides))
    except ConfigError as exc:
        return exc.problems
    return []


def test_config_keys_of_the_api(tmp_path):
    on = ["explorer.rollout_model.enable_openai_api=true"]
    history = ["explorer.rollout_model.enable_history=true"]
    assert _config_problems(tmp_path, on + history) == []
    two = ["explorer.rollout_model.engine_num=2"]
    assert _config_problems(tmp_path, on + two) == []  # a free port each
    fixed = ["explorer.rollout_model.openai_api_port=8000"]
    (problem,) = _config_problems(tmp_path, on + two + fixed)
    assert problem.startswith("explorer.rollout_model.openai_api_port = 8000 with ")
    assert "engine_num = 2" in problem and "set 0" in problem
    (problem,) = _config_problems(tmp_path, ["explorer.rollout_model.openai_api_port=70000"])
    assert (
        problem
        == "explorer.rollout_model.openai_api_port = 70000 must be in [0, 65535] (0: a free port)"
    )


def test_clients_share_one_http_pool_and_closing_one_spares_the_others(local):
    import gc

    from trinity.common.models import client as client_module

    first, second = wrapper(local), wrapper(local)
    one, other = first.get_openai_client(), second.get_openai_client()
    assert one._client is other._client  # one connection pool for the process
    with one:  # a workflow closing its client (or leaving a with-block)...
        one.chat.completions.create(model=one.model_path, messages=USER, max_tokens=2)
    other.chat.completions.create(model=other.model_path, messages=USER, max_tokens=2)
    # ...closes nothing the other clients use, and each reply went to its own wrapper.
    assert len(first.extract_experience_from_history()) == 1
    assert len(second.extract_experience_from_history()) == 1

    key = one.default_headers[client_module.RECORDER_HEADER]
    assert key in client_module._RECORDERS
    del first, one
    gc.collect()
    assert key not in client_module._RECORDERS  # a collected wrapper's recorder goes with it
