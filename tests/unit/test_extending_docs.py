"""docs/extending.md runs as written: every ``# plugins/<file>.py`` block is loaded from a
plugin folder the way ``trinity run --plugin-dir`` loads it and exercised, and every YAML
block passes the config check with those plugins registered. The engine's Ray host is
exercised in tests/integration/test_extending_plugins.py."""

import json
import re
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pytest
import torch
import yaml

from tests.unit.test_dataproto_view import CONFIG, group_experiences, make_trainer
from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM_TYPE,
    ENTROPY_LOSS_FN,
    KL_FN,
    POLICY_LOSS_FN,
    SAMPLE_STRATEGY,
)
from trinity.buffer import STORAGES, TASK_SELECTORS, TaskReader, build_selector
from trinity.buffer.file_reader import DataError
from trinity.buffer.operators import OPERATORS
from trinity.common.config import Config, ConfigError, FormatConfig, GenerationConfig, load_config
from trinity.common.config.base import validate_model
from trinity.common.config.schema_buffer import StorageConfig, TaskSelectorConfig
from trinity.common.experience import Experience, ExperienceBatch
from trinity.common.models.model import ModelWrapper
from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.common.workflows import WORKFLOWS, Task
from trinity.engine import ENGINES
from trinity.explorer.runner import WorkflowRunner
from trinity.monitor import MONITORS
from trinity.preflight.before_start import check_before_start
from trinity.preflight.derive import finalize, planned_steps
from trinity.preflight.served_engines import served_engine_problems
from trinity.preflight.unsupported import check_supported
from trinity.runtime.explorer_role import local_engine
from trinity.utils.plugin_loader import load_plugins

DOC = (Path(__file__).parents[2] / "docs" / "extending.md").read_text()
PLUGIN_BLOCKS = re.findall(r"```python\n# plugins/(\w+\.py)\n(.*?)```", DOC, re.S)
YAML_BLOCKS = re.findall(r"```yaml\n(.*?)```", DOC, re.S)
REGISTRIES = [
    WORKFLOWS,
    REWARD_FUNCTIONS,
    ALGORITHM_TYPE,
    ADVANTAGE_FN,
    POLICY_LOSS_FN,
    KL_FN,
    ENTROPY_LOSS_FN,
    SAMPLE_STRATEGY,
    TASK_SELECTORS,
    MONITORS,
    OPERATORS,
    ENGINES,
    STORAGES,
]


def loaded_plugins(blocks: List, folder: Path) -> Iterator[Dict[str, set]]:
    """A docs page's plugin files written to ``folder`` and loaded as ``--plugin-dir`` loads
    them; yields what each registry gained, by registry name, and restores the registries."""
    for name, code in blocks:
        (folder / name).write_text(code)
    with pytest.MonkeyPatch.context() as patch:
        before = {}
        for registry in REGISTRIES:
            patch.setattr(registry, "_modules", dict(registry._modules))
            before[registry.name] = set(registry.names())
        load_plugins([str(folder)])
        yield {r.name: set(r.names()) - before[r.name] for r in REGISTRIES}


def check_yaml_block(block: str, tmp_path: Path, micro_model: str, data: Dict) -> None:
    """A docs page's YAML block, merged into a small GRPO config, passes the config check
    and comes out of it as written."""
    algorithm = json.dumps({"algorithm_type": "grpo", "repeat_times": 4})
    text = CONFIG.format(root=tmp_path, model=micro_model, data=data["rl"], algorithm=algorithm)
    snippet = yaml.safe_load(block)
    merged = deep_merge(yaml.safe_load(textwrap.dedent(text)), snippet)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(merged))
    config = finalize(load_config(str(path)))
    assert_contains(config.model_dump(), snippet, "")


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """This page's plugins loaded; what each registry gained, by registry name."""
    yield from loaded_plugins(PLUGIN_BLOCKS, tmp_path_factory.mktemp("plugins"))


def test_every_extensible_registry_has_one_example(plugins):
    assert len(PLUGIN_BLOCKS) == 13
    assert plugins == {
        "workflows": {"exact_match_workflow"},
        "reward_functions": {"keyword_reward"},
        "algorithm_type": {"rloo_no_reference"},
        "advantage_fn": {"group_mean"},
        "policy_loss_fn": {"reinforce"},
        "kl_fn": {"squared"},
        "entropy_loss_fn": {"capped_entropy"},
        "sample_strategy": {"clip_reward"},
        "task_selectors": {"fixed_shuffle"},
        "monitors": {"csv"},
        "operators": {"banned_words_filter"},
        "engines": {"echo"},
        "storages": {"tsv"},
    }


class FakeEngine:
    """A rollout engine answering every chat with fixed texts (prompt: 2 tokens)."""

    def __init__(self, texts: List[str]) -> None:
        self.texts = texts
        self.prompts: List[List[Dict]] = []

    def chat(self, messages, params) -> List[Experience]:
        self.prompts.append(messages)
        return [
            Experience(tokens=[1, 2, 3], prompt_length=2, logprobs=[-0.5], response_text=text)
            for text in self.texts[: params.n]
        ]

    def model_version(self) -> int:
        return 0


def task(workflow: str, row: Dict, task_id: str, **kwargs: Any) -> Task:
    return Task(
        workflow=workflow,
        raw_task=row,
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=GenerationConfig(n=3),
        task_id=task_id,
        **kwargs,
    )


def test_workflow_example_scores_and_is_reused(plugins):
    engine = FakeEngine([" 4", "5", "4 "])
    runner = WorkflowRunner(engine, default_params={}, max_retry_times=0)
    first = runner.run_task(task("exact_match_workflow", {"question": "2+2=", "answer": 4}, "t0"))
    assert first.error is None
    assert [e.reward for e in first.experiences] == [1.0, 0.0, 1.0]
    assert {e.group_id for e in first.experiences} == {"t0"}
    assert engine.prompts[0] == [{"role": "user", "content": "2+2="}]
    # resettable: the next task goes to the same instance through reset()
    second = runner.run_task(task("exact_match_workflow", {"question": "1+4=", "answer": 5}, "t1"))
    assert [e.reward for e in second.experiences] == [0.0, 1.0, 0.0]
    assert engine.prompts[1] == [{"role": "user", "content": "1+4="}]


def test_reward_example_through_the_builtin_workflow(plugins):
    engine = FakeEngine(["the answer is 4", "4", "5"])
    runner = WorkflowRunner(engine, default_params={}, max_retry_times=0)
    row = {"question": "2+2=", "answer": "4"}
    result = runner.run_task(
        task(
            "simple_workflow", row, "t0", reward_fn="keyword_reward", reward_fn_args={"bonus": 0.5}
        )
    )
    assert result.error is None
    assert [e.reward for e in result.experiences] == [1.5, 1.0, 0.0]
    assert [e.metrics["accuracy"] for e in result.experiences] == [1.0, 1.0, 0.0]


def test_algorithm_example_trains_without_a_reference(
    tmp_path, micro_model, arithmetic_data, plugins
):
    trainer = make_trainer(
        tmp_path, micro_model, arithmetic_data, {"algorithm_type": "rloo_no_reference"}
    )
    algo = trainer.config.algorithm
    assert (algo.repeat_times, algo.advantage_fn, algo.kl_loss_fn) == (4, "rloo", "none")
    assert algo.policy_loss_fn == "ppo" and trainer.ref_model is None
    metrics = trainer.train_step(group_experiences(trainer.tokenizer))
    assert np.isfinite(metrics["actor/grad_norm"]) and "actor/kl_loss" not in metrics


def batch(rewards: List[float], groups: List[str]) -> ExperienceBatch:
    exps = [
        Experience(tokens=[1, 2, 3, 4], prompt_length=2, reward=r, group_id=g)
        for r, g in zip(rewards, groups, strict=True)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def test_advantage_example_on_hand_made_groups(plugins):
    cls = ADVANTAGE_FN.get("group_mean")
    assert cls.needs_groups is True and cls.default_args() == {"scale": 1.0}
    # group a: 1, 3 (mean 2); group b: 0, 2, 4 (mean 2); scale 0.5
    exps, metrics = cls(scale=0.5)(batch([1.0, 0.0, 3.0, 2.0, 4.0], ["a", "b", "a", "b", "b"]))
    expected = torch.tensor([-0.5, -1.0, 0.5, 0.0, 1.0]).unsqueeze(-1).expand(5, 2)
    assert torch.allclose(exps.advantages, expected) and exps.returns is exps.advantages
    assert metrics == {"group_mean/abs_advantage": pytest.approx(0.6)}


def test_policy_loss_example_value(plugins):
    cls = POLICY_LOSS_FN.get("reinforce")
    assert cls.select_keys == ("logprob", "action_mask", "advantages")
    loss, metrics = cls(scale=2.0)(
        logprob=torch.tensor([[-1.0, -2.0, -3.0]]),
        action_mask=torch.tensor([[1.0, 1.0, 0.0]]),
        advantages=torch.tensor([[1.0, 2.0, 5.0]]),
    )
    # per token 1, 4 (the third is masked): token-mean 2.5, times 2
    assert loss.item() == pytest.approx(5.0) and metrics == {"reinforce_loss": pytest.approx(5.0)}


def test_kl_example_as_loss_and_reward_penalty(plugins):
    kl = KL_FN.get("squared")(kl_coef=0.01)
    logprob, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    loss, metrics = kl.calculate_kl_loss(logprob, ref, torch.ones(1, 2))
    # squares 0.25 and 1: mean 0.625, times 0.01
    assert loss.item() == pytest.approx(0.00625) and metrics["kl_loss"] == pytest.approx(0.625)
    exps = batch([1.0], ["a"])
    exps.old_logprob, exps.ref_logprob = logprob, ref
    exps, _ = kl.apply_kl_penalty_to_reward(exps)
    assert torch.allclose(exps.token_level_rewards, torch.tensor([[-0.0025, 1.0 - 0.01]]))


def test_entropy_example_value(plugins):
    fn = ENTROPY_LOSS_FN.get("capped_entropy")(entropy_coef=0.1, cap=2.0)
    loss, metrics = fn(torch.tensor([[1.0, 3.0]]), torch.ones(1, 2), expert_mask=None)
    # capped entropies 1, 2: mean 1.5, times -0.1; the metric is the uncapped mean
    assert loss.item() == pytest.approx(-0.15) and metrics == {"entropy": pytest.approx(2.0)}


class ListReader:
    def __init__(self, experiences: List[Experience]) -> None:
        self.experiences = experiences

    def read(self, batch_size: int, timeout: Optional[float] = None) -> List[Experience]:
        taken, self.experiences = (
            self.experiences[:batch_size],
            self.experiences[batch_size:],
        )
        return taken


def test_sample_strategy_example_clips_and_counts(plugins):
    rewards = [0.5, 3.0, -2.0, None, 9.0]
    reader = ListReader([Experience(tokens=[1, 2], prompt_length=1, reward=r) for r in rewards])
    context = {"auxiliary_readers": {}, "group_size": 4, "max_response_tokens": 8}
    strategy = SAMPLE_STRATEGY.get("clip_reward")(reader, bound=1.0, **context)
    exps, metrics = strategy.sample(step=1, batch_size=4)
    assert [e.reward for e in exps] == [0.5, 1.0, -1.0, None]
    assert metrics == {"sample/clipped_rewards": 2.0}
    assert strategy.state_dict() == {}


def test_task_selector_example_order(plugins):
    selector = build_selector(TaskSelectorConfig(selector_type="fixed_shuffle", seed=7))
    first = selector.order(10, epoch=0)
    assert sorted(first) == list(range(10)) and first != list(range(10))
    assert selector.order(10, epoch=1) == first


def test_operator_example_rows_and_groups(plugins):
    op = OPERATORS.get("banned_words_filter")(words=["Sorry"])
    texts = [("a", "4"), ("a", "sorry, no"), ("b", "5"), ("b", "6")]
    exps = [
        Experience(tokens=[1, 2], prompt_length=1, group_id=g, response_text=t) for g, t in texts
    ]
    rows, metrics = op.process_experiences(exps, whole_groups=False)
    assert [e.response_text for e in rows] == ["4", "5", "6"] and metrics == {"banned": 1.0}
    groups, _ = op.process_experiences(exps, whole_groups=True)
    assert [e.group_id for e in groups] == ["b", "b"]
    with pytest.raises(ValueError, match="words is empty"):
        OPERATORS.get("banned_words_filter")(words=[])


def engine_config(
    tmp_path: Path, micro_model: str, data: Dict, engine_type: str, overrides: List[str] = ()
) -> Any:
    """A finalized config of the micro model whose rollout model runs on ``engine_type``."""
    algorithm = json.dumps({"algorithm_type": "grpo", "repeat_times": 4})
    text = CONFIG.format(root=tmp_path, model=micro_model, data=data["rl"], algorithm=algorithm)
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    overrides = [f"explorer.rollout_model.engine_type={engine_type}", *overrides]
    return finalize(load_config(str(path), overrides))


def test_engine_example_runs_in_the_in_process_host(
    tmp_path, micro_model, arithmetic_data, plugins
):
    config = engine_config(tmp_path, micro_model, arithmetic_data, "echo")
    engine = local_engine(config, "echo_engine")  # what a one-process stage starts
    try:
        assert type(engine.hosted) is ENGINES.get("echo")
        model = ModelWrapper(engine)
        replies = model.chat([{"role": "user", "content": "12+34="}], n=2)
        assert [e.response_text for e in replies] == ["12+3", "12+3"]  # max_response_tokens 4
        assert replies[0].logprobs.tolist() == [0.0] * 4 and replies[0].model_version == 0
        engine.load_weights({}, 3)  # as a weight sync does
        assert model.model_version == 3
    finally:
        engine.close()


def test_engine_example_serves_the_openai_api(tmp_path, micro_model, arithmetic_data, plugins):
    api = ["explorer.rollout_model.enable_openai_api=true"]
    config = engine_config(tmp_path, micro_model, arithmetic_data, "echo", api)
    assert served_engine_problems(config) == []
    engine = local_engine(config, "echo_engine")
    try:
        client = ModelWrapper(engine).get_openai_client()
        reply = client.completions.create(
            model=client.model_path, prompt="ab\n12+34=", max_tokens=4
        )
        assert reply.choices[0].text == "12+3"  # the echo of the last line, cut to 4 tokens
        chat = client.chat.completions.create(
            model=client.model_path, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert chat.choices[0].message.content is not None
    finally:
        engine.close()


def test_an_engine_without_served_model_is_refused_where_it_would_be_served(
    tmp_path, micro_model, arithmetic_data, plugins, monkeypatch
):
    echo = ENGINES.get("echo")
    monkeypatch.delattr(echo, "served_model")
    api = ["explorer.rollout_model.enable_openai_api=true"]
    config = engine_config(tmp_path, micro_model, arithmetic_data, "echo", api)
    assert served_engine_problems(config) == [
        "explorer.rollout_model.engine_type = echo: enable_openai_api: true serves it over the "
        "OpenAI-compatible API, but the engine has no served_model(name); add one "
        '(docs/extending.md, "Rollout engines") or use an engine that has it (transformers, vllm)'
    ]
    assert (
        served_engine_problems(engine_config(tmp_path, micro_model, arithmetic_data, "echo")) == []
    )


def deep_merge(base: Dict, over: Dict) -> Dict:
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = deep_merge(base[key], value) if both else value
    return merged


def assert_contains(final: Any, snippet: Any, path: str) -> None:
    """Every value the snippet sets is in the checked config (``taskset`` is ``tasksets[0]``)."""
    if not isinstance(snippet, dict):
        assert final == snippet, path
        return
    for key, value in snippet.items():
        inner = final["tasksets"][0] if key == "taskset" else final[key]
        assert_contains(inner, value, f"{path}.{key}")


@pytest.mark.parametrize("index", range(len(YAML_BLOCKS)))
def test_yaml_examples_pass_the_config_check(
    index, tmp_path, micro_model, arithmetic_data, plugins
):
    check_yaml_block(YAML_BLOCKS[index], tmp_path, micro_model, arithmetic_data)


def test_monitor_example_writes_rows_and_keeps_them_on_resume(plugins, tmp_path):
    sink = MONITORS.get("csv")(str(tmp_path), "p", "run_trainer", None, prefix="actor/")
    sink.log({"actor/pg_loss": 0.5, "critic/vf_loss": 1.0}, step=1)
    sink.log({"actor/pg_loss": 0.25}, step=2)
    sink.close()
    path = tmp_path / "monitor" / "run_trainer.csv"
    assert path.read_text().splitlines() == ["1,actor/pg_loss,0.5", "2,actor/pg_loss,0.25"]
    resumed = MONITORS.get("csv")(str(tmp_path), "p", "run_trainer", 1, prefix="actor/")
    resumed.close()  # a run resumed after step 1 redoes step 2
    assert path.read_text().splitlines() == ["1,actor/pg_loss,0.5"]


def tsv_taskset(folder: Path, text: str, **changes: Any) -> StorageConfig:
    """A taskset of the page's ``tsv`` storage, its file holding ``text``."""
    (folder / "tasks.tsv").write_text(text)
    fmt = FormatConfig(prompt_key="question", response_key="answer")
    values = dict(name="t", storage_type="tsv", path=str(folder / "tasks.tsv"), format=fmt)
    return StorageConfig(**{**values, **changes})


def test_storage_example_feeds_the_task_reader(plugins, tmp_path):
    storage = tsv_taskset(tmp_path, "question\tanswer\n1+2=\t3\n\n2+2=\t4\n5+1=\t6\n")
    reader = TaskReader(storage, total_epochs=2)
    assert [t.raw_task for t in reader.read_all()] == [
        {"question": "1+2=", "answer": "3"},
        {"question": "2+2=", "answer": "4"},
        {"question": "5+1=", "answer": "6"},
    ]
    assert reader.num_steps(2) == 3  # 3 rows x 2 epochs = 6 tasks, 2 per step
    assert [t.raw_task["question"] for t in reader.read(2)] == ["1+2=", "2+2="]
    assert reader.task(2).taskset_name == "t"


def test_storage_example_rows_get_the_row_checks(plugins, tmp_path):
    text = "question\tanswer\n1+2=\t3\n7+1=\n"  # the second row has no answer
    with pytest.raises(DataError) as info:
        TaskReader(tsv_taskset(tmp_path, text))
    where = f"buffer 't' (path '{tmp_path / 'tasks.tsv'}')"
    assert str(info.value) == (
        f"{where}: row 2: 'answer' is missing; set skip_bad_rows of buffer 't': true to skip it"
    )
    reader = TaskReader(tsv_taskset(tmp_path, text, skip_bad_rows=True))
    assert (len(reader), reader.num_skipped) == (1, 1)


def tsv_config(tmp_path: Path, micro_model: str, overrides: List[str]) -> Config:
    """The small GRPO config reading its taskset with the page's storage."""
    algorithm = json.dumps({"algorithm_type": "grpo", "repeat_times": 4})
    text = CONFIG.format(root=tmp_path, model=micro_model, data="", algorithm=algorithm)
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    taskset = "buffer.explorer_input.taskset"
    tsv = [f"{taskset}.storage_type=tsv", f"{taskset}.path={tmp_path / 'tasks.tsv'}"]
    return load_config(str(path), tsv + overrides)


def test_storage_example_rows_are_checked_and_counted_before_start(plugins, tmp_path, micro_model):
    (tmp_path / "tasks.tsv").write_text("question\tanswer\n1+2=\t3\n2+2=\t4\n5+1=\t6\n")
    with pytest.raises(ConfigError) as info:
        check_before_start(tsv_config(tmp_path, micro_model, ["buffer.batch_size=4"]))
    assert info.value.problems == [
        "buffer.batch_size = 4 exceeds the 3 rows of buffer.explorer_input.tasksets[0]: no "
        "explore step could be filled; use at most 3"
    ]
    (stage,) = check_before_start(tsv_config(tmp_path, micro_model, ["buffer.total_steps=null"]))
    assert planned_steps(stage) == 2  # 3 rows in batches of 2 (the last one short)


def test_storage_example_serves_where_rows_are_read_only(plugins):
    def refused(mode: str, buffer: Dict) -> List[str]:
        return check_supported(validate_model(Config, {"mode": mode, "buffer": buffer}))

    sft = {"trainer_input": {"experience_buffer": {"storage_type": "tsv"}}}
    assert refused("train", sft) == []  # SFT data
    assert refused("both", sft) == [  # the queue an explorer writes
        "buffer.trainer_input.experience_buffer.storage_type = tsv is not supported yet "
        "(supported: queue, sql)"
    ]
    tasks = {"explorer_input": {"taskset": {"storage_type": "tsvv"}}}
    assert refused("both", tasks) == [
        "buffer.explorer_input.tasksets[0].storage_type: unknown storage_type 'tsvv'; did you "
        "mean 'tsv'? (known: file, reasoning_gym, sql, tsv); a plugin's class is registered "
        "once its file is loaded with --plugin-dir"
    ]


def test_the_engine_example_implements_the_base_class_signatures(plugins):
    """The documented engine's methods take what the base class declares, which is what the
    hosts pass (the Ray host's ``chat`` passes ``session`` to every engine)."""
    import inspect

    from trinity.common.models.model import InferenceModel

    echo = ENGINES.get("echo")
    for name in ("chat", "generate", "generate_ids", "load_weights", "model_version"):
        declared = list(inspect.signature(getattr(InferenceModel, name)).parameters)
        assert list(inspect.signature(getattr(echo, name)).parameters) == declared, name
    chat = list(inspect.signature(InferenceModel.chat).parameters)
    assert chat == ["self", "messages", "params", "tools", "session"]
