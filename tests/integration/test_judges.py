"""examples/judges: RULER and rubric rewards from the tiny judge, 2 GRPO steps each.

The judge is the one ``prepare-quickstart --task judges`` builds (built once here, as shipped);
every stored experience carries the judge's reply and the reward read from it.
"""

import os

import pytest
import sqlalchemy as sa

from tests.integration.test_run import records
from trinity.buffer.codec import decode_experience
from trinity.common.workflows.judging import normalise_group, parse_ruler_scores, parse_score
from trinity.demo.judges import prepare_judges
from trinity.runtime.launcher import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.fixture(scope="module")
def judges_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("judges"))
    prepare_judges(root)
    return root


def stored(job_dir: str, name: str) -> list:
    engine = sa.create_engine(f"sqlite:///{job_dir}/buffer/{name}.db")
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT data FROM {name} ORDER BY id")).fetchall()
    return [decode_experience(row.data) for row in rows]


def two_steps(example: str, judges_dir: str, tmp_path, monkeypatch) -> tuple:
    monkeypatch.setenv("TRINITY_JUDGES_DIR", judges_dir)
    monkeypatch.delenv("JUDGE_MODEL", raising=False)
    config = os.path.join(ROOT, "examples", "judges", f"{example}.yaml")
    overrides = [f"checkpoint_root_dir={tmp_path}", "buffer.total_steps=2", "buffer.batch_size=4"]
    (result,) = run(config, overrides, [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    steps = [r for r in records(result.job_dir, "explorer") if "rollout/tasks_failed" in r]
    return result, steps


@pytest.mark.slow
def test_ruler_example_runs_two_steps_on_the_tiny_judge(
    judges_dir, tmp_path, monkeypatch, ray_cluster
):
    result, steps = two_steps("ruler", judges_dir, tmp_path, monkeypatch)
    assert len(steps) == 2
    groups: dict = {}
    for exp in stored(result.job_dir, "ruler_buffer"):
        groups.setdefault(exp.group_id, []).append(exp)
    assert groups and all(len(g) == 4 for g in groups.values())
    for group in groups.values():  # one reply per group, read as the rewards
        (reply,) = {e.info["judge_reply"] for e in group}
        scores = parse_ruler_scores(reply, 4, 10)
        assert [e.reward for e in group] == normalise_group(scores)


def test_rubric_example_runs_two_steps_on_the_tiny_judge(
    judges_dir, tmp_path, monkeypatch, ray_cluster
):
    result, steps = two_steps("rubric", judges_dir, tmp_path, monkeypatch)
    assert len(steps) == 2
    rows = stored(result.job_dir, "rubric_buffer")
    assert rows
    for exp in rows:  # 0.8 * correct + 0.2 * number, each score / 10
        replies = exp.info["judge_replies"]
        correct, number = parse_score(replies["correct"], 10), parse_score(replies["number"], 10)
        assert exp.reward == pytest.approx(0.8 * correct / 10 + 0.2 * number / 10)
        assert exp.metrics["rubric/correct"] == correct / 10
