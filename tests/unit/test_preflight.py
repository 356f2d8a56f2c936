"""The checks `trinity run` makes before Ray starts: argument binding, batch arithmetic,
sampling ranges, model folders, writable outputs, and how problems of stages are merged.

The whole-CLI behaviour (exit code 2, one message) is the corpus in
``tests/reliability/test_bad_configs.py``; these tests pin the rules' edges.
"""

import json
import os
import shutil
import textwrap

import pytest
from pydantic import ValidationError

from trinity.common.config import ConfigError, OptimizerConfig, load_config
from trinity.preflight.before_start import (
    _merge_stage_labels,
    check_before_start,
    writable_problems,
)
from trinity.preflight.components import bind_problems
from trinity.preflight.derive import derive
from trinity.preflight.model_folders import (
    chat_template_of,
    model_folder_problems,
    template_render_problem,
)
from trinity.preflight.validate import check_consistency
from trinity.utils.database import masked_url


class TakesAB:
    def __init__(self, a, b=1, **kwargs):
        pass


class TakesNothing:
    pass


def test_unknown_argument_named_with_the_nearest_parameter_despite_kwargs():
    found = bind_problems(TakesAB, {"a": 1, "bb": 2}, "algorithm.x_args", "x 'k'")
    assert found == [
        "algorithm.x_args.bb: x 'k' has no argument 'bb'; did you mean 'b'? (takes: a, b)"
    ]


def test_missing_required_argument_unless_the_caller_supplies_it():
    assert bind_problems(TakesAB, {}, "p", "x 'k'") == ["p: x 'k' needs the argument 'a'"]
    assert bind_problems(TakesAB, {"b": 2}, "p", "x 'k'", supplied=("a",)) == []


def test_a_class_without_constructor_takes_no_arguments():
    found = bind_problems(TakesNothing, {"scale": 2}, "p", "reward 'r'")
    assert found == ["p.scale: reward 'r' has no argument 'scale' (takes: no arguments)"]


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql://u:secret@host:5432/db", "postgresql://u:***@host:5432/db"),
        ("mysql://root@localhost/x", "mysql://root@localhost/x"),
        ("sqlite:///buffer.db", "sqlite:///buffer.db"),
    ],
)
def test_passwords_are_masked(url, shown):
    assert masked_url(url) == shown


def test_bools_are_not_numbers_inside_lists():
    with pytest.raises(ValidationError, match="true/false is not a number"):
        OptimizerConfig(betas=[0.9, False])
    assert OptimizerConfig(betas=[0.9, 0.99]).betas == (0.9, 0.99)


BASE = """
model: {model_path: /m, max_prompt_tokens: 8, max_response_tokens: 4}
algorithm: {algorithm_type: grpo, repeat_times: 4}
buffer:
  batch_size: 4
  explorer_input:
    taskset: {name: t, path: /d}
"""


def consistency(tmp_path, extra: str = "", overrides=()):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent(extra))
    config, _ = derive(load_config(str(path), list(overrides)))
    return check_consistency(config)


def test_mix_counts_only_the_rows_it_reads_from_the_experience_buffer(tmp_path):
    mix = ["algorithm.algorithm_type=mix", "algorithm.repeat_times=4"]
    # 20 rows, ratio 0.2: round(4.0) = 4 expert rows, 16 from the buffer = 4 * 4 explored.
    ok = mix + [
        "buffer.train_batch_size=20",
        "algorithm.sample_strategy_args.expert_data_ratio=0.2",
    ]
    assert consistency(tmp_path, overrides=ok) == []
    # 32 rows, ratio 0.25: 8 expert rows, 24 from the buffer > 16 explored per step.
    bad = mix + [
        "buffer.train_batch_size=32",
        "algorithm.sample_strategy_args.expert_data_ratio=0.25",
    ]
    assert consistency(tmp_path, overrides=bad) == [
        "buffer.train_batch_size = 32 (of which 24 from the experience buffer) exceeds one "
        "explore step's output, buffer.batch_size * algorithm.repeat_times = 4 * 4 = 16: the "
        "trainer would wait for experiences of a step that needs its own update first; use at "
        "most 16"
    ]


def test_step_output_uses_a_taskset_with_fewer_repeats(tmp_path):
    fewer = ["buffer.explorer_input.taskset.repeat_times=2"]
    assert consistency(tmp_path, overrides=fewer) == []  # the default follows: 4 * 2 = 8
    found = consistency(tmp_path, overrides=fewer + ["buffer.train_batch_size=16"])
    assert len(found) == 1 and "taskset 't' repeat_times = 4 * 2 = 8" in found[0]


def test_group_size_only_for_algorithms_whose_advantage_needs_groups(tmp_path):
    assert consistency(tmp_path, overrides=["buffer.train_batch_size=6"]) == [
        "buffer.train_batch_size = 6 is not a multiple of algorithm.repeat_times = 4: grpo "
        "trains on whole groups of 4 rollouts, so a step would split a group"
    ]
    # reinforce++ normalises over the batch, not per task: any size and one rollout are fine.
    plain = ["algorithm.algorithm_type=reinforceplusplus", "algorithm.repeat_times=1"]
    assert consistency(tmp_path, overrides=plain + ["buffer.train_batch_size=3"]) == []


@pytest.mark.parametrize(
    "key, value, ok",
    [
        ("temperature", 0, True),  # greedy
        ("temperature", -0.1, False),
        ("top_p", 1, True),
        ("top_p", 1.01, False),
        ("top_p", 0, False),
        ("top_k", 0, True),  # no limit, as -1
        ("top_k", -1, True),
        ("top_k", -2, False),
        ("top_k", 1, True),
    ],
)
def test_sampling_ranges(tmp_path, key, value, ok):
    found = consistency(tmp_path, overrides=[f"model.{key}={value}"])
    assert (found == []) is ok, found


def test_taskset_sampling_values_copied_from_model_are_reported_once(tmp_path):
    found = consistency(tmp_path, overrides=["model.top_p=2"])
    assert found == ["model.top_p = 2.0 must be in (0, 1] (1 is off)"]


@pytest.fixture
def model_copy(tmp_path, micro_model):
    return shutil.copytree(micro_model, tmp_path / "model")


def test_a_complete_model_folder_passes(model_copy):
    assert model_folder_problems("model.model_path", str(model_copy)) == []
    assert chat_template_of(str(model_copy)).startswith("{%- if tools %}")


def test_missing_tokenizer_and_weights_are_both_named(model_copy):
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        os.remove(model_copy / name)
    (found,) = model_folder_problems("k", str(model_copy))
    assert "no tokenizer files" in found and "no weights" in found


def test_chat_template_in_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert chat_template_of(str(tmp_path)) == "{{ messages }}"
    named = [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert chat_template_of(str(tmp_path)) == "d"
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    assert chat_template_of(str(tmp_path)) is None


def test_a_chat_template_that_cannot_render_a_conversation_is_refused(tmp_path, micro_model):
    """Checked before start by rendering system, user, assistant, user turns: a template
    that refuses a system turn (as some do) fails here rather than in the first task."""
    strict = (
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert template_render_problem(strict) == "TemplateError: System role not supported"
    assert template_render_problem("{% for m in messages %}{{ m.content }}") is not None  # syntax
    assert template_render_problem("{% for m in messages %}{{ m.content }}{% endfor %}") is None


def test_check_before_start_renders_the_chat_template(tmp_path, micro_model, arithmetic_data):
    strict = "{{ raise_exception('System role not supported') }}"
    config = good(tmp_path, micro_model, arithmetic_data["rl"])
    config.model.custom_chat_template = strict
    with pytest.raises(ConfigError) as info:
        check_before_start(config)
    assert info.value.problems == [
        "model.custom_chat_template fails to render a conversation: TemplateError: System role "
        "not supported"
    ]


def test_writable_targets(tmp_path):
    (tmp_path / "file").write_text("x")
    assert writable_problems("k", "v", str(tmp_path / "new" / "deeper"), True) == []
    under_file = writable_problems("k", "v", str(tmp_path / "file" / "ck"), True)
    assert under_file == [
        f"k = v: {tmp_path / 'file'} is a file, so the folders below it cannot be made"
    ]
    assert "is a folder; expected a file" in writable_problems("k", "v", str(tmp_path), False)[0]
    # an existing file (a resumed or shared SQLite database) is written in place
    assert writable_problems("k", "v", str(tmp_path / "file"), False) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    found = writable_problems("k", "v", str(locked / "ck"), True)
    assert found == [f"k = v: cannot write in {locked} (permission denied)"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_that_refuses_new_folders_even_to_root(tmp_path):
    # os.access says yes to root everywhere; /proc refuses mkdir all the same
    found = writable_problems("checkpoint_root_dir", "/proc/nope", "/proc/nope/p/n", True)
    assert found and found[0].startswith("checkpoint_root_dir = /proc/nope: cannot create folders")
    assert os.listdir(tmp_path) == [] and writable_problems("k", "v", str(tmp_path), True) == []
    assert os.listdir(tmp_path) == []  # the probe folder is gone again


def test_problems_of_several_stages_are_merged_and_labelled():
    found = [("p1", "a"), ("p1", "b"), ("p2", "b")]
    assert _merge_stage_labels(found, several=True) == ["stages 'a', 'b': p1", "stage 'b': p2"]
    assert _merge_stage_labels(found[:1], several=False) == ["p1"]


GOOD = """
checkpoint_root_dir: {root}
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 4}}
algorithm: {{algorithm_type: grpo, repeat_times: 4}}
buffer:
  batch_size: 4
  explorer_input:
    default_workflow_type: math_workflow
    taskset:
      name: t
      path: {data}
      format: {{prompt_key: question, response_key: answer}}
"""


def good(tmp_path, model, data, extra=""):
    path = tmp_path / "c.yaml"
    path.write_text(GOOD.format(root=tmp_path / "ck", model=model, data=data) + extra)
    return load_config(str(path))


def test_a_good_config_returns_its_finalized_stages(tmp_path, micro_model, arithmetic_data):
    (stage,) = check_before_start(good(tmp_path, micro_model, arithmetic_data["rl"]))
    assert stage.buffer.train_batch_size == 16 and stage.model.model_path == micro_model


def test_a_stage_after_a_training_stage_does_not_read_the_model_path(tmp_path, arithmetic_data):
    """The launcher points it at the previous stage's export; an explore stage exports none."""
    sft = (
        "stages:\n"
        "  - {stage_name: warm, mode: explore}\n"
        "  - stage_name: sft\n"
        "    mode: train\n"
        "    algorithm: {algorithm_type: sft}\n"
        "    buffer:\n"
        "      train_batch_size: 4\n"
        f"      trainer_input: {{experience_buffer: {{name: s, path: {arithmetic_data['sft']}}}}}\n"
        "  - {stage_name: rl}\n"
    )
    with pytest.raises(ConfigError) as info:
        check_before_start(good(tmp_path, "/nonexistent/model", arithmetic_data["rl"], sft))
    model_lines = [p for p in info.value.problems if "model.model_path" in p]
    assert model_lines == [
        "stages 'warm', 'sft': model.model_path = /nonexistent/model: no such folder "
        "/nonexistent/model (give a local folder, or a hub id such as "
        "HuggingFaceTB/SmolLM2-135M-Instruct)"
    ]


def test_a_stage_whose_data_folder_inherits_the_queue_is_told_to_set_file(
    tmp_path, micro_model, arithmetic_data
):
    """The guide's sft_warmup stage sets only the experience buffer's name and path; under a
    global queue buffer it inherits storage_type: queue, which keeps rows in a SQLite file."""
    sft = (
        "  trainer_input: {experience_buffer: {name: q, storage_type: queue}}\n"
        "stages:\n"
        "  - stage_name: sft_warmup\n"
        "    mode: train\n"
        "    algorithm: {algorithm_type: sft}\n"
        "    buffer:\n"
        "      train_batch_size: 4\n"
        f"      trainer_input: {{experience_buffer: {{name: s, path: {arithmetic_data['sft']}}}}}\n"
        "  - {stage_name: rft}\n"
    )
    with pytest.raises(ConfigError) as info:
        check_before_start(good(tmp_path, micro_model, arithmetic_data["rl"], sft))
    (problem,) = info.value.problems
    assert problem.startswith("stage 'sft_warmup': buffer.trainer_input.experience_buffer.path")
    assert "is a folder" in problem and "storage_type: file" in problem


DEAD_SERVER = "postgresql+psycopg://u:secret@127.0.0.1:1/db"  # nothing listens on port 1


@pytest.mark.parametrize("mode", ["explore", "train", "both"])
def test_an_unreachable_buffer_database_is_reported_in_every_mode_that_opens_it(
    tmp_path, micro_model, arithmetic_data, mode
):
    """A train run reads the store a separate explore run writes: its trainer would die on
    the connection after Ray started, so the check covers it as it covers the explorer."""
    buffer = (
        "  total_steps: 2\n"
        "  trainer_input:\n"
        f"    experience_buffer: {{name: exp, storage_type: queue, path: '{DEAD_SERVER}'}}\n"
    )
    config = good(tmp_path, micro_model, arithmetic_data["rl"], buffer + f"mode: {mode}\n")
    with pytest.raises(ConfigError) as info:
        check_before_start(config)
    expected = (
        "buffer.trainer_input.experience_buffer.path: cannot connect to database "
        "postgresql+psycopg://u:***@127.0.0.1:1/db"
    )
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems
    assert "secret" not in str(info.value)


def test_a_train_run_counting_steps_from_a_sql_taskset_checks_its_server(
    tmp_path, micro_model, arithmetic_data
):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    buffer = (
        "  trainer_input:\n"
        f"    experience_buffer: {{name: exp, storage_type: sql, path: '{store}'}}\n"
    )
    config = good(tmp_path, micro_model, arithmetic_data["rl"], buffer + "mode: train\n")
    taskset = config.buffer.explorer_input.tasksets[0]
    taskset.storage_type, taskset.path = "sql", DEAD_SERVER
    with pytest.raises(ConfigError) as info:
        check_before_start(config)
    assert any(
        p.startswith("buffer.explorer_input.tasksets[0].path: cannot connect to database")
        for p in info.value.problems
    ), info.value.problems
