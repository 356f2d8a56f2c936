"""The ``data_juicer`` operator running Data-Juicer itself (skipped where it is not installed:
``pip install 'trinity-rft[data_juicer]'``; the ``dev`` extra installs it)."""

import pytest

pytest.importorskip("data_juicer")

from trinity.buffer.operators import DataJuicerOperator, RewardShapingMapper, TaskContext  # noqa: E402
from trinity.common.experience import Experience  # noqa: E402


def exp(group, text, reward=1.0):
    return Experience(
        tokens=[1, 2, 3],
        prompt_length=2,
        reward=reward,
        group_id=group,
        response_text=text,
        prompt_text="q",
    )


def test_tasks_filtered_by_a_recipe_file(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("np: 1\nprocess:\n  - text_length_filter: {min_len: 3, max_len: 5}\n")
    rows = [{"q": "ab", "a": 1}, {"q": "abc", "a": 2}, {"q": "abcde", "a": 3}, {"q": "abcdef"}]
    op = DataJuicerOperator(config_path=str(recipe))
    kept, _ = op.process_tasks(rows, TaskContext(["q"]))
    assert kept == rows[1:3]  # the rows themselves come back, without Data-Juicer's columns


def test_task_text_rewritten_by_a_mapper():
    rows = [{"q": "  padded   text ", "a": 1}]
    op = DataJuicerOperator(operators=[{"whitespace_normalization_mapper": {}}])
    kept, _ = op.process_tasks(rows, TaskContext(["q"]))
    assert kept == [{"q": "padded   text", "a": 1}]


def test_experiences_get_the_scores_and_groups_stay_whole():
    exps = [exp("g1", "ok"), exp("g1", "a long answer"), exp("g2", "fine"), exp("g2", "good")]
    op = DataJuicerOperator(operators=[{"text_length_filter": {"min_len": 0, "max_len": 5}}])
    rows, _ = op.process_experiences(list(exps), whole_groups=False)
    assert [e.response_text for e in rows] == ["ok", "fine", "good"]
    assert [e.info["text_len"] for e in rows] == [2, 4, 4]
    groups, _ = op.process_experiences(list(exps), whole_groups=True)
    assert [e.group_id for e in groups] == ["g2", "g2"]
    # the guide's use: Data-Juicer scores, then reward_shaping_mapper adds them
    shaping = RewardShapingMapper([{"stats_key": "text_len", "op_type": "ADD", "weight": 0.5}])
    shaped, _ = shaping.process_experiences(groups, whole_groups=True)
    assert [e.reward for e in shaped] == [3.0, 3.0]


def test_an_unknown_data_juicer_operator_is_named():
    with pytest.raises(ValueError, match="Data-Juicer has no operator 'no_such_filter'"):
        DataJuicerOperator(operators=[{"no_such_filter": {}}])


def test_a_pipeline_operator_named_as_in_data_juicer_runs_through_it():
    """The guide's task pipeline lists Data-Juicer operators by their own names."""
    from trinity.buffer.pipelines import build_operators
    from trinity.common.config.schema_misc import OperatorConfig

    configs = [OperatorConfig(name="text_length_filter", args={"min_len": 3, "max_len": 5})]
    ((label, op),) = build_operators(configs)
    assert label == "text_length_filter" and isinstance(op, DataJuicerOperator)
    rows = [{"q": "ab"}, {"q": "abc"}, {"q": "abcdef"}]
    assert op.process_tasks(rows, TaskContext(["q"]))[0] == [{"q": "abc"}]


def test_a_misspelt_operator_is_named_with_the_closest_one(tmp_path):
    from trinity.common.config.schema_misc import OperatorConfig
    from trinity.preflight.operators import _operator_problems

    op = OperatorConfig(name="length_filtr", args={"max_len": 5})
    (problem,) = _operator_problems(op, "ops[0]", "task", False, {})
    assert problem.startswith("ops[0].name = length_filtr: not an operator of this build")
    assert "did you mean 'length_filter'?" in problem
    assert "Data-Juicer has no operator 'length_filtr'" in problem
