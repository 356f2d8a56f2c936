"""The original Trinity-RFT's workflows built here, against the in-process micro model (no
Ray): math_boxed_workflow, toolcall_workflow, math_eval_workflow, the on-policy distillation
workflows and the async_* names."""

import json

import pytest

from trinity.common.config import FormatConfig, GenerationConfig
from trinity.common.models.model import ModelWrapper
from trinity.common.rewards import REWARD_FUNCTIONS, RewardFn
from trinity.common.rewards.qwen_math import qwen_math_correct
from trinity.common.workflows import WORKFLOWS, Task
from trinity.common.workflows.boxed import BOXED_PROMPT, THINK_PROMPT
from trinity.common.workflows.qwen_math import QWEN_SYSTEM
from trinity.engine.transformers_model import TransformersInferenceModel

FORMAT = FormatConfig(prompt_key="question", response_key="answer")


@pytest.fixture(scope="module")
def model(micro_model):
    # The micro model's tokenizer reads characters: the original's prompts need room.
    engine = TransformersInferenceModel(
        model_path=micro_model, max_model_len=1200, max_prompt_tokens=1190, max_response_tokens=6
    )
    return ModelWrapper(engine)


def _task(workflow: str, **kw) -> Task:
    kw.setdefault("raw_task", {"question": "2+2=", "answer": "4"})
    kw.setdefault("format_args", FORMAT)
    return Task(workflow=workflow, rollout_args=GenerationConfig(n=3, temperature=1.0), **kw)


class Recorder(RewardFn):
    """Records what the workflow passes to its reward."""

    calls: list = []

    def __call__(self, response, truth=None, **kwargs):
        Recorder.calls.append({"response": response, "truth": truth, **kwargs})
        return {"accuracy": 1.0, "format_score": -0.25}


def test_the_async_names_are_the_same_workflows():
    for name in ("simple_workflow", "math_workflow", "math_boxed_workflow", "math_eval_workflow"):
        assert WORKFLOWS.get(f"async_{name}") is WORKFLOWS.get(name)
    assert WORKFLOWS.get("toolcall_workflow") is WORKFLOWS.get("tool_call_workflow")


def test_math_boxed_workflow_prompts_to_box_and_scores_with_math_boxed_reward(model):
    workflow = _task("math_boxed_workflow").to_workflow(model)
    assert workflow.messages == [
        {"role": "system", "content": BOXED_PROMPT},
        {"role": "user", "content": "2+2="},
    ]
    assert type(workflow.reward_fn) is REWARD_FUNCTIONS.get("math_boxed_reward")
    exps = workflow.run()
    assert len(exps) == 3
    for exp in exps:
        # A random micro model boxes nothing: accuracy 0, no format penalty asked for.
        assert exp.metrics == {"accuracy": 0.0, "format_score": 0.0} and exp.reward == 0.0
    thinking = _task("math_boxed_workflow", workflow_args={"with_think": True})
    assert thinking.to_workflow(model).messages[0]["content"] == THINK_PROMPT
    own = FormatConfig(prompt_key="question", response_key="answer", system_prompt="Be brief.")
    assert _task("math_boxed_workflow", format_args=own).to_workflow(model).messages[0] == {
        "role": "system",
        "content": "Be brief.",
    }


def test_math_boxed_workflow_passes_its_args_and_the_token_count_to_the_reward(model):
    Recorder.calls = []
    args = {"with_think": True, "format_score_coef": 0.3}
    task = _task("math_boxed_workflow", reward_fn=Recorder, workflow_args=args)
    exps = task.to_workflow(model).run()
    assert [c["response_tokens"] for c in Recorder.calls] == [e.response_length for e in exps]
    assert all(c["with_think"] is True and c["format_score_coef"] == 0.3 for c in Recorder.calls)
    assert all(c["truth"] == "4" for c in Recorder.calls)
    assert all(e.reward == pytest.approx(0.75) for e in exps)  # the components' sum


def test_math_boxed_workflow_use_base_samples_the_plain_text_prompt(model):
    task = _task("math_boxed_workflow", workflow_args={"use_base": True})
    workflow = task.to_workflow(model)
    prompt = f"System:{BOXED_PROMPT}\nUser:\n2+2=\nAssistant:\n"
    assert workflow.base_prompt() == prompt
    exps = workflow.run()
    assert len(exps) == 3 and all(e.prompt_text == prompt for e in exps)


def test_math_boxed_workflow_args_are_checked(model):
    task = _task("math_boxed_workflow", workflow_args={"with_thinking": True})
    with pytest.raises(ValueError, match="workflow_args.with_thinking"):
        task.to_workflow(model)


def test_math_dapo_reward_gets_the_token_count_from_simple_workflows(model):
    args = {
        "enable_overlong_penalty": True,
        "penalty_factor": 1.0,
        "max_response_length": 6,
        "cache_length": 2,
    }
    task = _task("math_workflow", reward_fn="math_dapo_reward", reward_fn_args=args)
    for exp in task.to_workflow(model).run():
        # max 6, cache 2: no penalty to 4 tokens, -(L - 4) / 2 to 6 (the micro model's limit).
        expected = -max(0, exp.response_length - 4) / 2
        assert exp.metrics["format_score"] == pytest.approx(expected)


TOOLACE = {
    "tools": json.dumps([{"name": "time", "description": "the time", "parameters": {}}]),
    "raw_system": "You are an assistant.",
    "conversations": [
        {"from": "human", "value": "What time is it?"},
        {"from": "function_call", "value": {"name": "time", "arguments": {}}},
        {"from": "observation", "value": "12:00"},
        {"from": "gpt", "value": "It is noon."},
        {"from": "user", "value": "And again?"},
    ],
    "answer": json.dumps([{"name": "time", "arguments": {}}]),
}


def test_toolcall_workflow_builds_the_toolace_conversation(model):
    task = _task("toolcall_workflow", raw_task=TOOLACE, format_args=FormatConfig())
    workflow = task.to_workflow(model)
    system, *turns = workflow.messages
    assert system["content"].startswith("You are an assistant.# Tools")
    tool_line = '{"type": "function", "function": {"name": "time", "description": "the time", '
    assert tool_line in system["content"] and "<tool_call>" in system["content"]
    assert [t["role"] for t in turns] == ["user", "assistant", "tool", "assistant", "user"]
    assert turns[1]["content"] == '{"name": "time", "arguments": {}}'
    assert workflow.truth == TOOLACE["answer"]
    exps = workflow.run()
    assert len(exps) == 3 and all(e.metrics == {"accuracy": 0.0} for e in exps)


def test_toolcall_workflow_names_a_missing_column(model):
    row = {k: v for k, v in TOOLACE.items() if k != "tools"}
    task = _task("toolcall_workflow", raw_task=row, format_args=FormatConfig())
    with pytest.raises(KeyError, match="no column 'tools'"):
        task.to_workflow(model)


def test_math_eval_workflow_samples_as_qwen_math_evaluates(model, monkeypatch):
    seen = []
    chat = model.chat
    monkeypatch.setattr(model, "chat", lambda m, **kw: seen.append(kw) or chat(m, **kw))
    workflow = _task("math_eval_workflow").to_workflow(model)
    assert workflow.messages == [
        {"role": "system", "content": QWEN_SYSTEM},
        {"role": "user", "content": f"2+2=\n{BOXED_PROMPT}"},
    ]
    exps = workflow.run()
    assert seen[0]["temperature"] == 0.6 and seen[0]["top_p"] == 0.8 and seen[0]["n"] == 3
    assert all(e.metrics["accuracy"] == e.reward == _correct(e) for e in exps)


def _correct(exp) -> float:
    # The last number counts as the answer: a random reply may hold a 4.
    return float(qwen_math_correct(exp.response_text, "4"))


def test_on_policy_distill_workflows(model):
    plain = _task("on_policy_distill_workflow").to_workflow(model)
    assert plain.messages == [{"role": "user", "content": "2+2="}]
    assert [e.reward for e in plain.run()] == [0.0, 0.0, 0.0]
    math = _task("on_policy_distill_math_workflow").to_workflow(model)
    assert math.messages[0] == {"role": "system", "content": QWEN_SYSTEM}
    assert all(e.metrics["accuracy"] == e.reward == _correct(e) for e in math.run())
