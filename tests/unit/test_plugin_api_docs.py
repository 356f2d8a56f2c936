"""docs/reference/plugin-api.md runs as written: every ``# plugins/<file>.py`` block is loaded
from a plugin folder the way ``trinity run --plugin-dir`` loads it and exercised, and every
YAML block passes the config check with those plugins registered."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.unit.test_dataproto_view import group_experiences, make_trainer
from tests.unit.test_extending_docs import (
    FakeEngine,
    batch,
    check_yaml_block,
    loaded_plugins,
    task,
)
from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN
from trinity.explorer.runner import WorkflowRunner

DOC = (Path(__file__).parents[2] / "docs" / "reference" / "plugin-api.md").read_text()
PLUGIN_BLOCKS = re.findall(r"```python\n# plugins/(\w+\.py)\n(.*?)```", DOC, re.S)
YAML_BLOCKS = re.findall(r"```yaml\n(.*?)```", DOC, re.S)


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """The page's plugins loaded; what each registry gained, by registry name."""
    yield from loaded_plugins(PLUGIN_BLOCKS, tmp_path_factory.mktemp("plugins"))


def test_the_page_registers_its_examples(plugins):
    assert len(PLUGIN_BLOCKS) == 3
    gained = {name: names for name, names in plugins.items() if names}
    assert gained == {
        "workflows": {"hinted_math_workflow", "majority_vote_workflow"},
        "algorithm_type": {"rank_pg"},
        "advantage_fn": {"centered_rank"},
        "policy_loss_fn": {"truncated_is_pg"},
    }


def test_hinted_workflow_with_and_without_a_reward_function(plugins):
    engine = FakeEngine([" 4", "5", "4"])
    runner = WorkflowRunner(engine, default_params={}, max_retry_times=0)
    row = {"question": "2+2=", "answer": 4}
    hinted = task("hinted_math_workflow", row, "t0", workflow_args={"hint": "Digits only."})
    result = runner.run_task(hinted)
    assert result.error is None
    assert [e.reward for e in result.experiences] == [1.0, 0.0, 1.0]
    assert [e.metrics["accuracy"] for e in result.experiences] == [1.0, 0.0, 1.0]
    assert engine.prompts[0] == [
        {"role": "system", "content": "Digits only."},
        {"role": "user", "content": "2+2="},
    ]
    # the taskset's reward function, when it names one (the runner reuses the instance)
    scored = task("hinted_math_workflow", row, "t1", reward_fn="math_reward")
    result = runner.run_task(scored)
    assert result.error is None and [e.reward for e in result.experiences][1] == 0.0
    assert engine.prompts[1] == [{"role": "user", "content": "2+2="}]


def test_async_workflow_runs_in_a_sequential_runner(plugins):
    engine = FakeEngine(["4", "4", "5"])
    runner = WorkflowRunner(engine, default_params={}, max_retry_times=0)
    result = runner.run_task(task("majority_vote_workflow", {"question": "2+2=", "answer": 4}, "t"))
    assert result.error is None
    assert [e.reward for e in result.experiences] == [1.0, 1.0, 0.0]
    assert {e.info["majority"] for e in result.experiences} == {"4"}
    assert result.experiences[0].metrics["agreement"] == pytest.approx(2 / 3)


def test_rank_advantage_on_hand_made_groups(plugins):
    fn = ADVANTAGE_FN.get("centered_rank")()
    # group a: 1, 3, 3 (ranks 0, 1.5, 1.5 of 2); group b: 0, 5 (ranks 0, 1 of 1)
    exps, _ = fn(batch([1.0, 0.0, 3.0, 5.0, 3.0], ["a", "b", "a", "b", "a"]))
    expected = torch.tensor([-1.0, -1.0, 0.5, 1.0, 0.5]).unsqueeze(-1).expand(5, 2)
    assert torch.allclose(exps.advantages, expected) and exps.returns is exps.advantages


def test_truncated_is_loss_value(plugins):
    loss_fn = POLICY_LOSS_FN.get("truncated_is_pg")(cap=1.5)
    logprob = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    loss, metrics = loss_fn(
        logprob=logprob,
        old_logprob=torch.tensor([[-1.0, -2.0]]),  # ratios 1 and e, capped at 1.5
        action_mask=torch.ones(1, 2),
        advantages=torch.tensor([[1.0, 1.0]]),
    )
    assert loss.item() == pytest.approx((1.0 + 1.5) / 2)
    assert metrics["is_weight"] == pytest.approx(1.25)
    loss.backward()
    assert torch.allclose(logprob.grad, torch.tensor([[-0.5, -0.75]]))


def test_rank_pg_trains_a_step(tmp_path, micro_model, arithmetic_data, plugins):
    trainer = make_trainer(tmp_path, micro_model, arithmetic_data, {"algorithm_type": "rank_pg"})
    algo = trainer.config.algorithm
    assert (algo.repeat_times, algo.advantage_fn, algo.policy_loss_fn) == (
        4,
        "centered_rank",
        "truncated_is_pg",
    )
    assert trainer.ref_model is None
    metrics = trainer.train_step(group_experiences(trainer.tokenizer))
    assert np.isfinite(metrics["actor/grad_norm"]) and "actor/is_weight" in metrics


@pytest.mark.parametrize("index", range(len(YAML_BLOCKS)))
def test_yaml_examples_pass_the_config_check(
    index, tmp_path, micro_model, arithmetic_data, plugins
):
    check_yaml_block(YAML_BLOCKS[index], tmp_path, micro_model, arithmetic_data)
