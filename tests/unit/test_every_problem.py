"""One refusal lists the problems of every phase of the checks (schema, support, derivation,
consistency, components, files), run on what of the config could be read; and reading the
config imports no torch, so a file that cannot be read at all is refused without it."""

import os
import subprocess
import sys
import textwrap

import pytest

import trinity
from trinity.algorithm import ALGORITHM_TYPE
from trinity.common.config import ConfigError, read_config
from trinity.common.config.base import MORE_MAY_FOLLOW
from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.common.workflows import WORKFLOWS

PLUGIN = "a plugin's class is registered once its file is loaded with --plugin-dir"
DOTTED = f"{PLUGIN}, or it is named by its dotted path (module.Class)"


def config_with_problems(tmp_path, micro_model, arithmetic_data) -> dict:
    """A GRPO config with a mistake for each phase of the checks."""
    evaluation = {
        "name": "e",
        "path": arithmetic_data["rl"],
        "split": "test",
        "format": {"prompt_key": "question", "response_key": "answer"},
        "default_workflow_type": "math_workfow",  # components: a misspelled workflow
        "default_reward_fn_type": "math_rewrd",  # and reward function
    }
    return {
        "checkpoint_root_dir": str(tmp_path / "checkpoints"),
        # schema: an unknown key; derivation: no response token limit
        "model": {"model_path": micro_model, "max_prompt_tokens": 16, "frobnicate": 1},
        "algorithm": {"algorithm_type": "grpoo", "repeat_times": 4},  # support: unknown name
        # consistency: no training taskset, and more rows per train step than a step makes
        "buffer": {
            "batch_size": 2,
            "train_batch_size": 64,
            "explorer_input": {"eval_tasksets": [evaluation]},
        },
    }


def refusal(config: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        trinity.run(config)
    return info.value


def test_problems_of_every_phase_come_in_one_refusal(tmp_path, micro_model, arithmetic_data):
    error = refusal(config_with_problems(tmp_path, micro_model, arithmetic_data))
    eval_taskset = "buffer.explorer_input.eval_tasksets[0]"
    algorithms, workflows, rewards = (
        ", ".join(registry.names()) for registry in (ALGORITHM_TYPE, WORKFLOWS, REWARD_FUNCTIONS)
    )
    assert error.problems == [
        "model.frobnicate: unknown key",
        "algorithm.algorithm_type: unknown algorithm_type 'grpoo'; did you mean 'grpo'? (known: "
        f"{algorithms}); {PLUGIN}",
        "model.max_model_len is unset and cannot be derived: set it, or set both "
        "model.max_prompt_tokens and model.max_response_tokens",
        "model.max_response_tokens is required in mode both",
        "buffer.train_batch_size = 64 exceeds one explore step's output, buffer.batch_size * "
        "algorithm.repeat_times = 2 * 4 = 8: the trainer would wait for experiences of a step "
        "that needs its own update first; use at most 8",
        "buffer.explorer_input.taskset is required in mode both",
        f"{eval_taskset}.default_workflow_type = math_workfow: workflows has no module named "
        f"'math_workfow'; did you mean 'math_workflow'? (known: {workflows}); {DOTTED}",
        f"{eval_taskset}.default_reward_fn_type = math_rewrd: reward_functions has no module "
        f"named 'math_rewrd'; did you mean 'math_reward'? (known: {rewards}); {DOTTED}",
    ]
    # the algorithm's own checks (its components, group sizes) wait for a known algorithm
    assert error.incomplete and str(error).endswith(f"\n{MORE_MAY_FOLLOW}")


def test_a_value_that_does_not_parse_is_checked_no_further(tmp_path, micro_model, arithmetic_data):
    """The checks after the schema read ``buffer.batch_size``'s default in its place: what
    they would say about it (the step arithmetic) is left out, and the rest is said."""
    config = config_with_problems(tmp_path, micro_model, arithmetic_data)
    config["algorithm"]["algorithm_type"] = "grpo"
    config["buffer"]["batch_size"] = "many"
    error = refusal(config)
    assert error.problems[:2] == [
        "model.frobnicate: unknown key",
        "buffer.batch_size: expected int, got 'many' (Input should be a valid integer, unable "
        "to parse string as an integer)",
    ]
    assert not [p for p in error.problems if "buffer.batch_size *" in p]
    assert "buffer.explorer_input.taskset is required in mode both" in error.problems
    assert any(p.startswith("model.max_response_tokens is required") for p in error.problems)
    assert error.incomplete


def test_unknown_keys_alone_leave_nothing_unchecked(tmp_path, micro_model, arithmetic_data):
    config = config_with_problems(tmp_path, micro_model, arithmetic_data)
    config["algorithm"]["algorithm_type"] = "grpo"
    error = refusal(config)
    assert error.problems[0] == "model.frobnicate: unknown key"
    assert len(error.problems) == 7 and not error.incomplete
    assert MORE_MAY_FOLLOW not in str(error)


@pytest.mark.parametrize(
    "stage, problem",
    [
        ({"mode": "train"}, "stages[0].stage_name: required key is missing"),
        # its name is left out for not being valid, and then it has none: said once
        ({"stage_name": "../up"}, "stages[0].stage_name: '../up' is not a valid name"),
    ],
    ids=["no-name", "bad-name"],
)
def test_a_stage_that_cannot_be_read_stops_the_checks_there(stage, problem):
    """A stage without a name cannot be left out (the others would be renumbered), so
    nothing after the schema runs, and the message says more may follow."""
    error = refusal({"model": {"frob": 1}, "stages": [stage]})
    assert error.problems[0] == "model.frob: unknown key"
    assert len(error.problems) == 2 and error.problems[1].startswith(problem)
    assert error.incomplete


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def imported(stderr: str) -> set:
    """The modules ``python -X importtime`` reports as imported."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def test_reading_a_config_with_schema_problems_imports_no_torch(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model: {frobnicate: 1}\nbuffer: {batch_size: many}\n")
    code = textwrap.dedent(
        """
        import sys
        from trinity.common.config import read_config
        _, problems, unread = read_config(sys.argv[1])
        print(problems, unread)
        """
    )
    out = _python(code, str(path))
    assert out.returncode == 0, out.stderr
    assert "model.frobnicate: unknown key" in out.stdout and "['buffer.batch_size']" in out.stdout
    modules = imported(out.stderr)
    assert "trinity.common.config.loader" in modules and "torch" not in modules


@pytest.mark.parametrize(
    "text, overrides, said",
    [
        ("model: [unclosed\n", [], "not valid YAML"),
        (
            "model: {max_prompt_tokens: 8}\n",
            ["model.frobnicate"],
            "must look like section.key=value",
        ),
    ],
    ids=["yaml", "override"],
)
def test_trinity_run_refuses_what_it_cannot_read_without_torch(tmp_path, text, overrides, said):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "trinity.cli.main", "run"]
        + ["--config", str(path), *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert out.returncode == 2, out.stderr
    assert said in out.stderr and MORE_MAY_FOLLOW in out.stderr
    modules = imported(out.stderr)
    assert "trinity.common.config.loader" in modules and "torch" not in modules


def test_read_config_returns_what_could_be_read(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model: {frobnicate: 1, max_prompt_tokens: 8}\nmode: bth\n")
    config, problems, unread = read_config(str(path))
    assert config.model.max_prompt_tokens == 8 and config.mode == "both"  # the default
    assert problems[0].startswith("mode: expected one of 'both'")
    assert problems[1] == "model.frobnicate: unknown key"
    assert unread == ["mode"]  # an unknown key is read by nothing: only mode took a default
