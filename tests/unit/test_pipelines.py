"""Task and experience pipelines, and their checks before Ray starts."""

import textwrap

import pytest

from trinity.buffer.operators.data_juicer import INSTALL, DataJuicerOperator, data_juicer_missing
from trinity.buffer.pipelines import ExperiencePipeline, TaskPipeline, build_operators
from trinity.buffer.rows import Rows
from trinity.common.config import ConfigError, load_config
from trinity.common.config.schema_misc import OperatorConfig, TaskPipelineConfig
from trinity.common.experience import Experience
from trinity.preflight.before_start import check_before_start


def ops(*pairs):
    return build_operators([OperatorConfig(name=n, args=a) for n, a in pairs])


def exp(group, response, reward):
    return Experience(tokens=[1] + response, prompt_length=1, reward=reward, group_id=group)


def test_experience_pipeline_runs_in_order_and_counts_per_operator():
    exps = [exp("a", [5], 1.0), exp("a", [5], 1.0), exp("a", [6, 7, 8], 0.0), exp("b", [5], 0.2)]
    pipeline = ExperiencePipeline(
        ops(
            ("deduplicator", {}),
            ("length_filter", {"max_length": 2}),
            ("reward_filter", {"min_reward": 0.5}),
        ),
        whole_groups=False,
    )
    kept, metrics = pipeline.run(exps)
    assert [e.reward for e in kept] == [1.0]
    assert metrics["pipeline/experiences_in"] == 4 and metrics["pipeline/experiences_out"] == 1
    assert metrics["pipeline/deduplicator/dropped"] == 1
    assert metrics["pipeline/length_filter/dropped"] == 1
    assert metrics["pipeline/reward_filter/dropped"] == 1
    assert metrics["pipeline/reward_filter/kept"] == 1
    assert metrics["pipeline/reward_filter/no_reward"] == 0


def test_an_operator_named_twice_is_labelled_by_position():
    pipeline = ExperiencePipeline(
        ops(("reward_filter", {"min_reward": 0}), ("reward_filter", {"max_reward": 0.5})), False
    )
    kept, metrics = pipeline.run([exp("a", [1], 0.2), exp("a", [2], 0.7), exp("b", [3], -1.0)])
    assert [e.reward for e in kept] == [0.2]
    assert metrics["pipeline/reward_filter_0/dropped"] == 1
    assert metrics["pipeline/reward_filter_1/dropped"] == 1


def test_a_step_emptied_by_the_pipeline_is_an_empty_list():
    pipeline = ExperiencePipeline(ops(("reward_filter", {"min_reward": 2})), whole_groups=True)
    assert pipeline.run([exp("a", [1], 1.0)])[0] == []


def _task_pipeline(tmp_path, operators, target_fields=()):
    config = _config(tmp_path, "/m", str(tmp_path))
    config.data_processor.task_pipeline = TaskPipelineConfig(target_fields=list(target_fields))
    return TaskPipeline(ops(*operators), config)


def test_task_pipeline_keeps_rows_and_column_types(tmp_path):
    data = Rows.from_list(
        [
            {"question": "1+1", "answer": 2},
            {"question": "1+1", "answer": 3},
            {"question": "10+10", "answer": 20},
        ]
    )
    config = _config(tmp_path, "/m", str(tmp_path))
    storage = config.buffer.explorer_input.tasksets[0]
    pipeline = _task_pipeline(tmp_path, [("deduplicator", {})])
    out = pipeline.apply(data, storage)  # the taskset's prompt_key is question
    assert out.to_list() == [data[0], data[2]] and out.table.schema == data.table.schema
    both = _task_pipeline(tmp_path, [("deduplicator", {})], ["question", "answer"])
    assert len(both.apply(data, storage)) == 3
    short = _task_pipeline(tmp_path, [("length_filter", {"max_length": 3, "unit": "characters"})])
    assert short.apply(data, storage).to_list() == data.to_list()[:2]


def test_task_pipeline_that_keeps_nothing_is_an_error(tmp_path):
    data = Rows.from_list([{"question": "1+1", "answer": "2"}])
    storage = _config(tmp_path, "/m", str(tmp_path)).buffer.explorer_input.tasksets[0]
    pipeline = _task_pipeline(
        tmp_path, [("length_filter", {"min_length": 99, "unit": "characters"})]
    )
    with pytest.raises(ValueError, match="task_pipeline kept no row of taskset 't'"):
        pipeline.apply(data, storage)


def test_task_reader_reads_only_the_kept_rows(tmp_path, arithmetic_data):
    from trinity.buffer import TaskReader

    config = _config(tmp_path, "/m", arithmetic_data["rl"])
    storage = config.buffer.explorer_input.tasksets[0]
    plain = TaskReader(storage)
    one_digit = [("length_filter", {"max_length": 1, "unit": "characters"})]
    reader = TaskReader(storage, pipeline=_task_pipeline(tmp_path, one_digit, ["answer"]))
    expected = [r for r in plain.rows.to_list() if len(r["answer"]) == 1]
    assert 0 < len(reader) == len(expected) < len(plain)
    assert [t.raw_task for t in reader.read_all()] == expected


# ---- data_juicer ------------------------------------------------------------------------
@pytest.fixture
def without_data_juicer(monkeypatch):
    """Data-Juicer looks uninstalled (CI installs it with the dev extra)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "data_juicer" else real(name, *a),
    )
    assert data_juicer_missing() is not None


def test_data_juicer_missing_says_how_to_install(without_data_juicer):
    with pytest.raises(ValueError, match="Data-Juicer is not installed") as info:
        DataJuicerOperator(operators=[{"text_length_filter": {"min_len": 1}}])
    assert INSTALL in str(info.value)


def test_data_juicer_recipe_is_checked_before_data_juicer_is_needed(tmp_path):
    with pytest.raises(ValueError, match="exactly one of config_path"):
        DataJuicerOperator()
    with pytest.raises(ValueError, match="no such file"):
        DataJuicerOperator(config_path=str(tmp_path / "none.yaml"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("np: 2\nprocess:\n  - text_length_filter: [1]\n")
    with pytest.raises(ValueError, match=r"process\[0\].text_length_filter = \[1\]"):
        DataJuicerOperator(config_path=str(recipe))


# ---- checks before Ray ------------------------------------------------------------------
CONFIG = """
checkpoint_root_dir: {root}
mode: {mode}
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


def _config(tmp_path, model, data, extra="", mode="both", overrides=()):
    path = tmp_path / "c.yaml"
    text = CONFIG.format(root=tmp_path / "ck", model=model, data=data, mode=mode)
    path.write_text(text + textwrap.dedent(extra))
    return load_config(str(path), list(overrides))


def problems(tmp_path, micro_model, arithmetic_data, extra, mode="both", overrides=()):
    config = _config(tmp_path, micro_model, arithmetic_data["rl"], extra, mode, overrides)
    with pytest.raises(ConfigError) as info:
        check_before_start(config)
    return info.value.problems


def test_good_pipelines_pass(tmp_path, micro_model, arithmetic_data):
    extra = """
    data_processor:
      task_pipeline:
        target_fields: [question]
        operators: [{name: deduplicator}, {name: length_filter, args: {max_length: 30}}]
      experience_pipeline:
        operators:
          - {name: reward_filter, args: {min_reward: 0.1}}
          - name: reward_shaping_mapper
            args:
              reward_shaping_configs:
                - {stats_key: llm_quality_score, op_type: ADD, weight: 1.0}
    """
    config = _config(tmp_path, micro_model, arithmetic_data["rl"], extra)
    (stage,) = check_before_start(config)
    assert [op.name for op in stage.data_processor.experience_pipeline.operators] == [
        "reward_filter",
        "reward_shaping_mapper",
    ]


def test_bad_operators_are_named_before_ray(tmp_path, micro_model, arithmetic_data):
    extra = """
    data_processor:
      task_pipeline:
        operators: [{name: reward_filter, args: {min_reward: 0}}, {name: deduplicater}]
      experience_pipeline:
        operators:
          - {name: length_filter, args: {max_len: 3}}
          - {name: reward_filter, args: {min_reward: 1, max_reward: 0}}
    """
    found = problems(tmp_path, micro_model, arithmetic_data, extra)
    assert (
        "data_processor.task_pipeline.operators[0].name = reward_filter: it does not process "
        "tasks; put it in data_processor.experience_pipeline"
    ) in found
    assert any(
        p.startswith(
            "data_processor.task_pipeline.operators[1].name = deduplicater: not an operator of "
            "this build (did you mean 'deduplicator'?)"
        )
        for p in found
    )
    assert (
        "data_processor.experience_pipeline.operators[0].args.max_len: operator 'length_filter' "
        "has no argument 'max_len'; did you mean 'max_length'? (takes: min_length, max_length, "
        "unit, chat_template)"
    ) in found


def test_bad_operator_values_are_named_before_ray(tmp_path, micro_model, arithmetic_data):
    extra = """
    data_processor:
      experience_pipeline:
        operators: [{name: reward_filter, args: {min_reward: 1, max_reward: 0}}]
    """
    assert problems(tmp_path, micro_model, arithmetic_data, extra) == [
        "data_processor.experience_pipeline.operators[0].args: min_reward, max_reward: the "
        "minimum 1 is above the maximum 0"
    ]


def test_the_pipeline_input_is_what_the_training_taskset_reads(
    tmp_path, micro_model, arithmetic_data
):
    """As the guide's example: the taskset gives the format, ``inputs`` the data."""
    extra = f"""
    data_processor:
      task_pipeline:
        inputs: [{arithmetic_data["rl"]}]
        operators: [{{name: deduplicator}}]
    """
    unset = ["buffer.explorer_input.taskset.path=null"]
    config = _config(tmp_path, micro_model, "null", extra, overrides=unset)
    (stage,) = check_before_start(config)
    assert stage.buffer.explorer_input.tasksets[0].path == arithmetic_data["rl"]


def test_a_taskset_path_beside_the_pipeline_input_was_its_output(
    tmp_path, micro_model, arithmetic_data, caplog
):
    """Trinity-RFT 0.3 wrote the pipeline's output to the taskset's path: that path is not
    read (one line says so), the pipeline's input is."""
    extra = f"""
    data_processor:
      task_pipeline:
        inputs: [{arithmetic_data["rl"]}]
        operators: [{{name: deduplicator}}]
    """
    output = ["buffer.explorer_input.taskset.path=./outputs/task_pipeline_output/"]
    config = _config(tmp_path, micro_model, "null", extra, overrides=output)
    with caplog.at_level("WARNING", logger="trinity.config"):
        (stage,) = check_before_start(config)
    assert stage.buffer.explorer_input.tasksets[0].path == arithmetic_data["rl"]
    lines = [r.getMessage() for r in caplog.records if "task_pipeline_output" in r.getMessage()]
    assert len(lines) == 1 and "is not read" in lines[0]


@pytest.mark.parametrize(
    "inputs, expected",
    [
        (
            "[/data/a.jsonl, /data/b.jsonl]",
            "data_processor.task_pipeline.inputs: more than one input is not supported yet; "
            "give one dataset path",
        ),
    ],
)
def test_pipeline_inputs_that_cannot_run(tmp_path, micro_model, arithmetic_data, inputs, expected):
    extra = f"""
    data_processor:
      task_pipeline:
        inputs: {inputs}
        operators: [{{name: deduplicator}}]
    """
    found = problems(tmp_path, micro_model, arithmetic_data, extra)
    assert expected.format(data=arithmetic_data["rl"]) in found, found


def test_target_fields_must_be_columns(tmp_path, micro_model, arithmetic_data):
    extra = """
    data_processor:
      task_pipeline:
        target_fields: [prompt]
        operators: [{name: deduplicator}]
    """
    (line,) = problems(tmp_path, micro_model, arithmetic_data, extra)
    assert line.startswith(
        "data_processor.task_pipeline.target_fields: 'prompt' is not a column of "
        "buffer.explorer_input.tasksets[0]"
    )


def test_data_juicer_missing_is_a_config_error_with_the_command(
    tmp_path, micro_model, arithmetic_data, without_data_juicer
):
    extra = """
    data_processor:
      experience_pipeline:
        operators: [{name: data_juicer, args: {operators: [{text_length_filter: {}}]}}]
    """
    (line,) = problems(tmp_path, micro_model, arithmetic_data, extra)
    assert line.startswith(
        "data_processor.experience_pipeline.operators[0].args: Data-Juicer is not installed"
    )
    assert line.endswith(INSTALL)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_data_juicer_service_is_named():
    """A service reached by URL needs no local Data-Juicer; a dead one is named with the fix."""
    from trinity.common.config.schema_misc import DataJuicerServiceConfig

    url = f"http://127.0.0.1:{_free_port()}"
    service = DataJuicerServiceConfig(server_url=url)
    op = DataJuicerOperator(operators=[{"text_length_filter": {}}], service=service)
    with pytest.raises(RuntimeError, match=f"Data-Juicer service at {url} cannot be reached"):
        op.process_experiences([exp("a", [1], 1.0)], whole_groups=False)


def test_service_settings_name_one_server(tmp_path, micro_model, arithmetic_data):
    extra = """
    service:
      data_juicer: {server_url: 'http://127.0.0.1:5005', auto_start: true, port: 6000}
    """
    assert problems(tmp_path, micro_model, arithmetic_data, extra) == [
        "service.data_juicer.server_url = http://127.0.0.1:5005, but auto_start starts the "
        "server at http://127.0.0.1:6000 (service.data_juicer.port); set server_url to "
        "http://127.0.0.1:6000 or leave it out"
    ]


def test_a_service_url_nothing_answers_at_is_refused_before_start(
    tmp_path, micro_model, arithmetic_data
):
    """0.3.0's experience-pipeline example names a service it expects the user to run."""
    url = f"http://127.0.0.1:{_free_port()}"
    extra = f"""
    service:
      data_juicer: {{server_url: '{url}'}}
    """
    assert problems(tmp_path, micro_model, arithmetic_data, extra) == [
        f"service.data_juicer.server_url = {url}: no Data-Juicer service answers there (GET "
        "/health); start it (python -m trinity.buffer.operators.dj_service --port PORT) or set "
        "service.data_juicer.auto_start: true"
    ]


def test_a_data_juicer_llm_operator_needs_its_api_before_start(
    tmp_path, micro_model, arithmetic_data, monkeypatch
):
    """0.4.0's task-pipeline example scores tasks with an API model: Data-Juicer reads its
    base URL from OPENAI_BASE_URL; a local model (is_hf_model) needs none."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    extra = """
    data_processor:
      task_pipeline:
        operators:
          - name: llm_difficulty_score_filter
            args: {api_or_hf_model: qwen2.5-7b-instruct, min_score: 0.0}
          - name: text_length_filter
    """
    assert problems(tmp_path, micro_model, arithmetic_data, extra) == [
        "data_processor.task_pipeline.operators[0]: Data-Juicer's llm_difficulty_score_filter "
        "calls api_or_hf_model = qwen2.5-7b-instruct as an OpenAI-compatible API, and "
        "OPENAI_BASE_URL is not set; export it (and OPENAI_API_KEY), or give a local model with "
        "is_hf_model: true"
    ]
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    config = _config(tmp_path, micro_model, arithmetic_data["rl"], extra)
    check_before_start(config)  # raises nothing


def test_pipelines_of_a_mode_without_exploring_are_named_in_a_warning(
    tmp_path, micro_model, arithmetic_data, caplog
):
    """The training YAML run as the trainer of a decoupled pair (mode train) keeps its
    data_processor: it is not an error, and the warning says it does not run there."""
    extra = """
    data_processor:
      experience_pipeline:
        operators: [{name: reward_filter, args: {min_reward: 0}}, {name: no_such_operator}]
    """
    sft = [
        "algorithm.algorithm_type=sft",
        "buffer.train_batch_size=4",
        f"buffer.trainer_input.experience_buffer={{name: s, path: {arithmetic_data['sft']}}}",
    ]
    config = _config(tmp_path, micro_model, arithmetic_data["rl"], extra, "train", sft)
    with caplog.at_level("WARNING", logger="trinity.config"):
        check_before_start(config)
    assert (
        "data_processor.experience_pipeline.operators = ['reward_filter', 'no_such_operator']: "
        "mode train explores no training tasks; pipelines run in modes both, explore"
    ) in caplog.text
