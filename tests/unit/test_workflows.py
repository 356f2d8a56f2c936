"""Built-in workflows and ModelWrapper against a real in-process rollout engine (no Ray)."""

import pytest

from trinity.common.config import FormatConfig, GenerationConfig
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows import WORKFLOWS, Task
from trinity.engine.transformers_model import TransformersInferenceModel


@pytest.fixture(scope="module")
def model(micro_model):
    engine = TransformersInferenceModel(
        model_path=micro_model, max_model_len=64, max_prompt_tokens=48, max_response_tokens=6
    )
    return ModelWrapper(engine)


def test_chat_returns_experiences_with_the_guide_fields(model):
    exps = model.chat([{"role": "user", "content": "1+2="}], n=3, temperature=1.0)
    assert len(exps) == 3
    for e in exps:
        assert e.prompt_length > 0 and len(e.tokens) > e.prompt_length
        assert len(e.logprobs) == len(e.tokens) - e.prompt_length
        assert isinstance(e.response_text, str)


def test_generate_concatenates_per_prompt(model):
    exps = model.generate(["ab", "cd"], n=2, temperature=0.0, max_tokens=3)
    assert len(exps) == 4
    assert exps[0].prompt_text == "ab" and exps[2].prompt_text == "cd"


def test_unknown_sampling_argument_is_an_error(model):
    with pytest.raises(TypeError, match="temprature"):
        model.chat([{"role": "user", "content": "x"}], temprature=1.0)


def _task(**kw) -> Task:
    return Task(
        workflow="math_workflow",
        raw_task={"question": "2+2=", "answer": "4"},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=GenerationConfig(n=4, temperature=1.0),
        **kw,
    )


def test_math_workflow_scores_every_sample(model):
    task = _task()
    exps = task.to_workflow(model).run()
    assert len(exps) == 4
    for e in exps:
        assert e.reward in (0.0, 1.0) and e.metrics["accuracy"] == e.reward


def test_workflow_reset_reuses_the_instance(model):
    wf = _task().to_workflow(model)
    other = _task()
    other.raw_task = {"question": "3+3=", "answer": "6"}
    assert wf.resettable()
    wf.reset(other)
    assert wf.messages[-1]["content"] == "3+3=" and wf.truth == "6"


def test_missing_prompt_column_names_the_key(model):
    task = _task()
    task.raw_task = {"q": "1+1="}
    with pytest.raises(KeyError, match="format.prompt_key"):
        WORKFLOWS.get("math_workflow")(model=model, task=task)


def test_simple_workflow_needs_a_reward_fn(model):
    task = _task()
    task.workflow = "simple_workflow"
    with pytest.raises(ValueError, match="default_reward_fn_type"):
        task.to_workflow(model)


def test_rollout_args_stop_and_logprobs_reach_the_engine(model, monkeypatch):
    """The taskset's stop strings and logprobs count reach the engine's sampling params (the
    engine's handling of both is tested in test_hf_engine)."""
    seen = []
    submit = model.engine._submit

    async def spy(prompt_ids, params):
        seen.append(params)
        return await submit(prompt_ids, params)

    monkeypatch.setattr(model.engine, "_submit", spy)
    task = _task()
    task.rollout_args = GenerationConfig(n=2, temperature=1.0, stop=["ab", "c"], logprobs=2)
    exps = task.to_workflow(model).run()
    assert [(p.stop, p.top_logprobs) for p in seen] == [(["ab", "c"], 2)]
    for e in exps:
        assert len(e.info["top_logprobs"]) == e.response_length
        assert all(len(step) == 2 for step in e.info["top_logprobs"])
