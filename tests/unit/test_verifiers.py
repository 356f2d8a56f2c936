"""verifiers_workflow: episodes of verifiers environments the tests define with verifiers' own
API (tests/unit/vf_envs: ``echo``, one turn with a reward and a metric; ``calc``, a tool served
over MCP), run by verifiers' null harness against the project's OpenAI-compatible server on
loopback. Experiences are the engine's tokens, the reward the environment's; the failures that
fail a task; the checks before start."""

import asyncio
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, List

import pytest
import torch
from transformers import AutoTokenizer

from tests.unit.test_openai_server import LocalServer, make_engine
from trinity.common.config import GenerationConfig
from trinity.common.config.base import ConfigError, validate_model
from trinity.common.experience import Experience
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows.multiturn import conversations
from trinity.engine.server import ServedModel

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None,
    reason='verifiers is not installed (pip install -e ".[verifiers]")',
)
ENVS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vf_envs")
ECHO, CALC = "vf_echo", "vf_calc"
WORDS = ["apple", "river", "stone"]  # vf_echo's first tasks: "Say apple." ...
NULL_HARNESS = {"agent": {"harness": {"id": "null"}}}


@pytest.fixture(scope="module")
def local(micro_model):
    host = LocalServer(make_engine(micro_model), micro_model)
    yield host
    host.close()


def workflow(engine: Any, env_id: str, row: dict, n: int = 1, **args: Any) -> Any:
    from trinity.common.workflows import Task

    task = Task(
        workflow="verifiers_workflow",
        raw_task=row,
        rollout_args=GenerationConfig(n=n, temperature=1.0, max_tokens=8),
        workflow_args={"env_id": env_id, "env_dir": ENVS, "env_config": NULL_HARNESS, **args},
        taskset_name="vf",
        index=2,
    )
    return task.to_workflow(ModelWrapper(engine))


def play(engine: Any, env_id: str, row: dict, n: int = 1, **args: Any) -> List[Experience]:
    return workflow(engine, env_id, row, n, **args).run()


def test_single_turn_episodes_are_the_engines_tokens_scored_by_the_environment(local):
    exps = play(local, ECHO, {"task_index": 1}, n=2)
    assert len(exps) == 2
    template = local.model.engine.apply_chat_template
    prompt = template([{"role": "user", "content": "Say river."}], None)
    decode = local.model.engine.tokenizer.decode
    for exp in exps:
        assert exp.tokens[: exp.prompt_length].tolist() == prompt
        reply = exp.tokens[exp.prompt_length :].tolist()
        assert exp.action_mask.all() and len(exp.logprobs) == len(reply) > 0
        text = exp.response_text
        assert decode(reply, skip_special_tokens=True) == text
        assert exp.reward == pytest.approx(0.5 * min(len(text), 20) / 20)
        assert exp.metrics == {
            "length": pytest.approx(min(len(text), 20) / 20),
            "chars": len(text),
            "turns": 1,
        }
        assert exp.info["env_id"] == ECHO and exp.info["turns"] == 1


def test_a_dotted_module_path_is_loaded_as_the_environment(local, monkeypatch):
    """verifiers' loader imports top-level names only; a dotted path reaches the same module."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # env_dir goes first on both: undone after
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    dotted = "vf_envs." + ECHO
    (exp,) = play(local, dotted, {"task_index": 1}, env_dir=os.path.dirname(ENVS))
    text = exp.response_text
    assert exp.reward == pytest.approx(0.5 * min(len(text), 20) / 20)
    assert exp.info["env_id"] == dotted


def test_tasks_that_overlap_on_one_environment_each_finish(local, monkeypatch):
    """Runners run on threads of one process, each running tasks of one environment at once
    on its own event loop (asynchronous mode): every task's episodes come back whole. Two
    hazards of verifiers made this hang or raise: an environment keeps its serving
    resources on itself (overlapping serving() tore down each other's), and its subprocess
    runtime prepares a harness's uv script under one asyncio lock for all event loops."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    from trinity.common.workflows import verifiers_env

    # as in a fresh process: no harness script prepared yet, no task run to its end
    monkeypatch.setattr(SubprocessRuntime, "_interpreters", {})
    monkeypatch.setattr(SubprocessRuntime, "_locks", {})
    monkeypatch.setattr(verifiers_env, "_PREPARED", set())

    def runner(rounds: int) -> list:
        async def at_once() -> list:
            flows = [workflow(local, ECHO, {"task_index": i}, n=2) for i in range(3)]
            return await asyncio.wait_for(asyncio.gather(*(f.run_async() for f in flows)), 170)

        return [exps for _ in range(rounds) for exps in asyncio.run(at_once())]

    with ThreadPoolExecutor(2) as pool:
        results = [exps for done in pool.map(runner, [2, 2], timeout=600) for exps in done]
    assert [len(exps) for exps in results] == [2] * 12
    template = local.model.engine.apply_chat_template
    prompts = [template([{"role": "user", "content": f"Say {w}."}], None) for w in WORDS]
    for i, exps in enumerate(results):
        assert all(e.tokens[: e.prompt_length].tolist() == prompts[i % 3] for e in exps)


def test_a_row_without_task_index_is_the_tasks_data(local):
    (exp,) = play(local, ECHO, {"prompt": "Say grass.", "word": "grass"})
    prompt = local.model.engine.apply_chat_template(
        [{"role": "user", "content": "Say grass."}], None
    )
    assert exp.tokens[: exp.prompt_length].tolist() == prompt
    with pytest.raises(ValueError, match=r"row 2: not a task of this environment: column 'prompt'"):
        play(local, ECHO, {"prompt": 5})
    with pytest.raises(ValueError, match=r"'task_index' must be an integer in \[0, 4\).*got 9"):
        play(local, ECHO, {"task_index": 9})


class ScriptedEngine:
    """The micro engine's tokenizer writing given replies: each call samples the next one."""

    def __init__(self, engine: Any, replies: List[str]) -> None:
        self.tokenizer, self.replies = engine.engine.tokenizer, list(replies)

    async def generate_ids(self, prompt_ids: List[int], params: Any) -> List[Experience]:
        text = self.replies.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        prompt_text = self.tokenizer.decode(prompt_ids)
        info = {"finish_reason": "stop"}
        return [
            Experience(
                tokens=prompt_ids + ids,
                prompt_length=len(prompt_ids),
                logprobs=[-0.5] * len(ids),
                prompt_text=prompt_text,
                response_text=text,
                info=info,
            )
        ]


TOOL_CALL = '<tool_call>\n{"name": "calc_add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def scripted_tool_episode(model_path: str, replies: List[str], **engine_args: Any) -> Experience:
    """One episode of ``calc`` whose replies are ``replies``, written with the model's tokenizer
    (its weights are not used) and ``make_engine``'s chat template unless given one."""
    engine = make_engine(model_path, **engine_args)
    served = replace(  # room for the tools' system turn in characters
        ServedModel.from_transformers(engine, "scripted"),
        model=ScriptedEngine(engine, replies),
        max_model_len=4096,
    )
    host = LocalServer(None, "scripted", served)
    try:
        (exp,) = play(host, CALC, {"task_index": 0})
    finally:
        host.close()
    return exp


def test_a_tool_episode_is_one_experience_with_the_tool_result_masked(micro_model):
    exp = scripted_tool_episode(micro_model, [TOOL_CALL, "It is 5."])
    tokenizer = AutoTokenizer.from_pretrained(micro_model)
    response = exp.tokens[exp.prompt_length :].tolist()
    mask = exp.action_mask.tolist()
    trained = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if m])
    context = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if not m])
    assert trained == TOOL_CALL + "<|im_end|>" + "It is 5." + "<|im_end|>"
    assert "<|im_start|>tool\n5<|im_end|>" in context  # the tool's answer, not trained
    assert exp.logprobs[torch.tensor(mask, dtype=torch.bool)].eq(-0.5).all()
    assert exp.reward == 1.0 and exp.metrics == {"correct": 1.0, "turns": 2}
    assert exp.info["turns"] == 2 and exp.turn_starts[0] == 0


def test_an_environment_that_raises_fails_the_task_with_its_error(local):
    from trinity.common.workflows.verifiers_env import EnvError

    fail = {"env_args": {"task": {"fail_on": "apple"}}}
    with pytest.raises(EnvError, match=r"episode failed: .*scoring broke on 'apple'"):
        play(local, ECHO, {"task_index": 0}, **fail)
    assert len(play(local, ECHO, {"task_index": 1}, **fail)) == 1  # other tasks still run
    # the failed episode's replies were taken from the server all the same
    assert asyncio.run(_nothing_left(local))


async def _nothing_left(local: Any) -> bool:
    import httpx

    async with httpx.AsyncClient(base_url=local.server.url) as http:
        answer = await http.post("/trinity/records/take", json={"key": "anything"})
    return answer.json() == {"replies": []}


@pytest.mark.parametrize(
    "args, problem",
    [
        ({"env_id": "no_such_vf_env"}, "verifiers environment 'no_such_vf_env' is not installed"),
        ({"env_id": "vf_old"}, "'vf_old' is written for verifiers 0.3 (load_environment() "),
        (
            {"env_id": ECHO, "env_args": {"num_tasks": "many"}},
            "env_args.num_tasks: Input should be",
        ),
        (
            {"env_id": ECHO, "env_config": {"agent": {"max_turns": "x"}}},
            "env_config.agent.max_turns: Input should be",
        ),
        ({"env_id": ""}, "env_id: expected str, got '' (String should have at least 1"),
    ],
)
def test_arguments_the_loader_refuses_are_config_errors_naming_the_key(args, problem):
    from trinity.common.workflows.verifiers import VerifiersArgs

    with pytest.raises(ConfigError) as caught:
        where = "buffer.explorer_input.taskset.workflow_args"
        validate_model(VerifiersArgs, {"env_dir": ENVS, **args}, where)
    assert any(problem in p for p in caught.value.problems), caught.value.problems
    assert all(
        p.startswith("buffer.explorer_input.taskset.workflow_args") for p in caught.value.problems
    )


def test_calls_group_into_the_conversations_they_continue():
    def exp(tokens: List[int], prompt: int) -> Experience:
        return Experience(
            tokens=tokens, prompt_length=prompt, logprobs=[0.0] * (len(tokens) - prompt)
        )

    a1, b1 = exp([1, 2, 3], 2), exp([7, 8], 1)
    a2, b2 = exp([1, 2, 3, 4, 5], 4), exp([7, 8, 9], 2)
    redo = exp([1, 9, 9], 2)  # the first conversation re-rendered: a new one
    groups = conversations([a1, b1, a2, redo, b2])
    assert [[id(e) for e in g] for g in groups] == [[id(a1), id(a2)], [id(b1), id(b2)], [id(redo)]]
