"""Every workflow and reward name the original Trinity-RFT registered (releases 0.1.1 to
0.5.2, and the names its example configs use) either runs here or is refused before start
saying what it needs; docs/reference/original-names.md lists each with what it is here."""

import re
import textwrap
from pathlib import Path

import pytest

from tests.unit.test_preflight import BASE
from trinity.algorithm import ALGORITHM_TYPE
from trinity.common.config import load_config
from trinity.common.original_names import NOT_HERE, not_here
from trinity.common.registry import Registry
from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.common.workflows import WORKFLOWS
from trinity.preflight.components import component_problems
from trinity.preflight.derive import derive

# The original's registries at 0.1.1, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 0.5.0 and 0.5.2, and the
# names its examples' configs give (toolcall_workflow after its 0.4.0 rename, the examples'
# plugin modules).
ORIGINAL_WORKFLOWS = """
simple_workflow async_simple_workflow math_workflow async_math_workflow math_boxed_workflow
async_math_boxed_workflow math_eval_workflow async_math_eval_workflow math_rm_workflow
async_math_rm_workflow toolcall_workflow tool_call_workflow agentscope_workflow_adapter
agentscope_workflow_adapter_v1 agentscope_react_workflow agentscope_react_math_workflow
agentscope_reactv2_math_workflow as_react_workflow agentscopev0_react_math_workflow
agentscope_v1_react_search_workflow email_search_workflow alfworld_workflow
RAFT_alfworld_workflow RAFT_reflect_alfworld_workflow frozen_lake_workflow sciworld_workflow
webshop_workflow step_wise_alfworld_workflow async_math_ruler_workflow math_ruler_workflow
math_trainable_ruler_workflow rubric_judge_workflow rubric_judge_openai_workflow
simple_mm_workflow async_simple_mm_workflow on_policy_distill_workflow
on_policy_distill_math_workflow sudoku_workflow bots_ref_eval_collect_math_boxed_workflow
examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow
examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow
examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow
""".split()
ORIGINAL_REWARDS = """
rm_gallery_reward math_reward math_boxed_reward format_reward countdown_reward accuracy_reward
math_dapo_reward
""".split()
# The original's algorithm types whose names this project did not have (the others are its own).
ORIGINAL_ALGORITHMS = ["grpo_verl", "multi_step_grpo"]
REGISTRIES = [
    (WORKFLOWS, ORIGINAL_WORKFLOWS),
    (REWARD_FUNCTIONS, ORIGINAL_REWARDS),
    (ALGORITHM_TYPE, ORIGINAL_ALGORITHMS),
]
PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "original-names.md"


@pytest.mark.parametrize(
    "registry, name",
    [(registry, name) for registry, names in REGISTRIES for name in names],
    ids=lambda x: x if isinstance(x, str) else x.name,
)
def test_each_original_name_runs_or_is_refused_with_what_it_needs(registry, name):
    if name in registry:
        assert registry.get(name) is not None
        assert not_here(registry.name, name) is None  # never both
        return
    with pytest.raises(KeyError) as err:
        registry.get(name)
    message = err.value.args[0]
    assert message.startswith("the original's ") and message.endswith("; not supported yet")


def test_the_table_holds_only_the_originals_names():
    assert set(NOT_HERE) == {registry.name for registry, _ in REGISTRIES}
    for registry, names in REGISTRIES:
        assert set(NOT_HERE[registry.name]) <= set(names)


def test_a_plugin_registering_an_originals_name_is_used():
    workflows = Registry("workflows")
    with pytest.raises(KeyError, match="alfworld environment package"):
        workflows.get("alfworld_workflow")
    plugin = type("AlfworldPlugin", (), {})
    workflows.register_module("alfworld_workflow", plugin)
    assert workflows.get("alfworld_workflow") is plugin


def test_a_name_the_original_never_had_still_gets_the_generic_error():
    with pytest.raises(KeyError, match="has no module named 'alfworld_workflw'"):
        WORKFLOWS.get("alfworld_workflw")


def test_refused_before_start_with_the_key_and_what_it_needs(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(BASE)
        + "    default_workflow_type: alfworld_workflow\n"
        + "    default_reward_fn_type: rm_gallery_reward\n"
    )
    config, _ = derive(load_config(str(path), []))
    problems = component_problems(config, construct=False)
    assert (
        "buffer.explorer_input.default_workflow_type = alfworld_workflow: the original's "
        "ALFWorld workflow needs the alfworld environment package (with textworld) and its "
        "game files; not supported yet"
    ) in problems
    assert any(
        p.startswith("buffer.explorer_input.default_reward_fn_type = rm_gallery_reward: ")
        and "rm-gallery package" in p
        and "not supported yet" in p
        for p in problems
    )


def _page_rows() -> dict:
    """name -> what the page says it is here, from the page's tables."""
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", PAGE.read_text(), re.M)
    return {name: here.strip() for name, here in rows}


def test_the_reference_page_lists_each_original_name_as_the_code_has_it():
    rows = _page_rows()
    for registry, names in REGISTRIES:
        for name in names:
            assert name in rows, f"{name} missing from {PAGE.name}"
            refused = not_here(registry.name, name) is not None
            assert rows[name].startswith("refused") == refused, name


def test_the_originals_workflow_and_reward_arguments_are_checked_before_start(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(BASE)
        + "    default_workflow_type: math_boxed_workflow\n"
        + "    default_reward_fn_type: math_dapo_reward\n"
    )
    taskset = "buffer.explorer_input.taskset"
    overrides = [
        f"{taskset}.workflow_args={{with_thinking: true}}",
        f"{taskset}.reward_fn_args={{enable_overlong_penalty: true, penalty_factor: 1.0}}",
    ]
    config, _ = derive(load_config(str(path), overrides))
    assert component_problems(config, construct=False) == [
        "buffer.explorer_input.tasksets[0].workflow_args.with_thinking: unknown key; did you "
        "mean 'with_think'?",
        "buffer.explorer_input.tasksets[0].reward_fn_args: reward 'math_dapo_reward': "
        "enable_overlong_penalty needs penalty_factor, max_response_length and cache_length",
    ]
