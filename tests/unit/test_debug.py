"""trinity debug: tasks run through the workflow in this process, every experience printed."""

import os

from typer.testing import CliRunner

from trinity.cli.main import app

TESTS = os.path.dirname(os.path.dirname(__file__))
CONFIG = os.path.join(TESTS, "integration", "configs", "grpo_small.yaml")
RAISING = """
from trinity.common.workflows import Workflow
from trinity.common.workflows.workflow import WORKFLOWS


@WORKFLOWS.register_module("debug_raising_workflow")
class Raising(Workflow):
    def run(self):
        raise ZeroDivisionError("the workflow under test divided by zero")
"""


def debug(tmp_path, micro_model, data, *extra, plugins=()):
    args = ["debug", "--config", CONFIG, "--tasks", "2"]
    args += [arg for plugin in plugins for arg in ("--plugin-dir", plugin)]
    overrides = [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={micro_model}",
        f"buffer.explorer_input.taskset.path={data['rl']}",
        f"buffer.explorer_input.eval_tasksets.0.path={data['rl']}",
        *extra,
    ]
    return CliRunner().invoke(app, [*args, *overrides])


def test_each_experience_is_printed_with_its_mask_and_numbers(
    tmp_path, micro_model, arithmetic_data
):
    result = debug(tmp_path, micro_model, arithmetic_data)
    assert result.exit_code == 0, result.output
    out = result.output
    # two tasks of the training taskset, each with repeat_times=4 experiences
    assert "task debug-arith_train-0 (MathWorkflow" in out
    assert "task debug-arith_train-1 (MathWorkflow" in out
    assert out.count("experience 3 (") == 2
    # max_response_tokens=4: every response token was sampled, so every one is trained on
    assert out.count(" + 4 response, 4 trained on") == 8
    assert "<|im_start|>user" in out  # the prompt as the model saw it, special tokens included
    assert "logprobs  mean -" in out and "reward    0.0" in out
    assert not os.path.exists(os.path.join(tmp_path, "tests"))  # nothing written: no run


def test_an_eval_taskset_by_name(tmp_path, micro_model, arithmetic_data):
    result = debug(tmp_path, micro_model, arithmetic_data, "buffer.explorer_input.taskset=null")
    assert result.exit_code == 2  # no training taskset: no stage explores
    result = CliRunner().invoke(
        app,
        ["debug", "--config", CONFIG, "--taskset", "nope", f"model.model_path={micro_model}"]
        + [f"buffer.explorer_input.taskset.path={arithmetic_data['rl']}"]
        + [f"buffer.explorer_input.eval_tasksets.0.path={arithmetic_data['rl']}"]
        + [f"checkpoint_root_dir={tmp_path}"],
    )
    assert result.exit_code == 2
    assert "--taskset nope: no such taskset; the config has ['arith_train', 'arith_test']" in (
        result.output
    )


def test_a_raising_workflow_shows_its_traceback(tmp_path, micro_model, arithmetic_data):
    plugin = tmp_path / "plugins"
    plugin.mkdir()
    (plugin / "raising.py").write_text(RAISING)
    result = debug(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.taskset.default_workflow_type=debug_raising_workflow",
        plugins=[str(plugin)],
    )
    assert result.exit_code == 1
    assert "ZeroDivisionError: the workflow under test divided by zero" in result.output
    assert "raising.py" in result.output and "in run" in result.output


def test_a_workflow_on_the_openai_client_runs_against_an_in_process_server(
    tmp_path, micro_model, arithmetic_data
):
    plugins = os.path.join(TESTS, "integration", "plugins_openai")
    result = debug(
        tmp_path,
        micro_model,
        arithmetic_data,
        "explorer.rollout_model.enable_openai_api=true",
        "explorer.rollout_model.enable_history=true",
        "buffer.explorer_input.taskset.default_workflow_type=openai_example_workflow",
        plugins=[plugins],
    )
    assert result.exit_code == 0, result.output
    assert "task debug-arith_train-0 (OpenAIExampleWorkflow" in result.output
    assert result.output.count(" trained on") == 8  # recorded replies: 2 tasks x 4 samples


STAGES = """
stages:
  - stage_name: sft
    mode: train
    algorithm: {algorithm_type: sft}
    buffer:
      train_batch_size: 4
      trainer_input:
        experience_buffer:
          name: sft_data
          path: SFT
          format: {prompt_key: prompt, response_key: response}
  - stage_name: grpo
"""


def staged_config(tmp_path, data) -> str:
    """grpo_small.yaml run as the quickstart is: a train-only sft stage, then grpo."""
    with open(CONFIG, encoding="utf-8") as f:
        text = f.read()
    path = tmp_path / "staged.yaml"
    path.write_text(text + STAGES.replace("SFT", data["sft"]))
    return str(path)


def test_the_first_stage_that_explores_is_debugged_not_a_train_only_one(
    tmp_path, micro_model, arithmetic_data
):
    """The sft stage inherits the global taskset but never explores (mode train)."""
    config = staged_config(tmp_path, arithmetic_data)
    result = CliRunner().invoke(
        app,
        ["debug", "--config", config, "--tasks", "1", f"checkpoint_root_dir={tmp_path}"]
        + [f"model.model_path={micro_model}"]
        + [f"buffer.explorer_input.taskset.path={arithmetic_data['rl']}"]
        + [f"buffer.explorer_input.eval_tasksets.0.path={arithmetic_data['rl']}"],
    )
    assert result.exit_code == 0, result.output
    assert "4 experience(s)" in result.output  # grpo's repeat_times, not sft's 1


def test_an_unknown_stage_lists_the_stages_with_the_closest(tmp_path, arithmetic_data):
    config = staged_config(tmp_path, arithmetic_data)
    for wanted, expected in [
        ("grpp", "--stage grpp: no such stage; did you mean 'grpo'? (stages: sft, grpo)"),
        ("nope", "--stage nope: no such stage (stages: sft, grpo)"),
        ("sft", "--stage sft: stage 'sft' has mode train and does not explore"),
    ]:
        result = CliRunner().invoke(app, ["debug", "--config", config, "--stage", wanted])
        assert result.exit_code == 2, result.output
        assert expected in " ".join(result.output.split()), result.output


def test_the_weights_are_named_and_can_be_chosen(tmp_path, micro_model, arithmetic_data):
    result = debug(tmp_path, micro_model, arithmetic_data)
    assert result.output.startswith(f"debugging grpo_small with {micro_model} (model.model_path)")
    result = CliRunner().invoke(
        app,
        ["debug", "--config", CONFIG, "--model", str(tmp_path / "nope")]
        + [f"model.model_path={micro_model}", f"checkpoint_root_dir={tmp_path}"]
        + [f"buffer.explorer_input.taskset.path={arithmetic_data['rl']}"]
        + [f"buffer.explorer_input.eval_tasksets.0.path={arithmetic_data['rl']}"],
    )
    assert result.exit_code == 2
    assert f"--model {tmp_path / 'nope'}: no such folder" in " ".join(result.output.split())
