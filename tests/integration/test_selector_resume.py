"""A run with the adaptive ``diff_based`` selector saves what it learned with every explore
step, and a resumed run carries on from it instead of starting the selector afresh."""

import json
import os
import sqlite3

import pytest

from tests.integration.conftest import base_overrides
from trinity.buffer.selector_state import selector_state_path
from trinity.runtime.launcher import run

CONFIG = os.path.join(os.path.dirname(__file__), "configs", "grpo_small.yaml")


def explored_rows(job_dir: str) -> dict:
    """Explore step -> the taskset rows its experiences came from (group id
    ``train-<step>-<taskset>-<row>``)."""
    database = os.path.join(job_dir, "buffer", "experience_buffer.db")
    with sqlite3.connect(database) as conn:
        groups = {g for (g,) in conn.execute("SELECT DISTINCT group_id FROM experience_buffer")}
    rows: dict = {}
    for group in groups:
        _, step, _, row = group.split("-")
        rows.setdefault(int(step), set()).add(int(row))
    return rows


@pytest.mark.parametrize("style", ["fixed", "fully_async"])
def test_diff_based_state_is_saved_and_resumed(
    tmp_path, micro_model, arithmetic_data, ray_cluster, style
):
    overrides = [
        *base_overrides(tmp_path, micro_model, arithmetic_data),
        f"synchronizer.sync_style={style}",
        "explorer.eval_on_startup=false",
        "explorer.eval_interval=100",
        "buffer.explorer_input.taskset.data_selector={selector_type: diff_based, seed: 1}",
    ]
    (first,) = run(CONFIG, [*overrides, "buffer.total_steps=2"], [])
    with open(selector_state_path(first.job_dir)) as f:
        saved = json.load(f)
    assert sorted(saved) == ["1", "2"]
    learned = saved["2"]
    early = explored_rows(first.job_dir)
    assert set(learned["indices"]) == early[1] | early[2]  # fed back: every row explored

    (second,) = run(CONFIG, [*overrides, "buffer.total_steps=4"], [])
    assert second.job_dir == first.job_dir
    with open(selector_state_path(second.job_dir)) as f:
        resumed = json.load(f)
    assert sorted(resumed) == ["3", "4"]
    late = explored_rows(second.job_dir)
    assert sorted(late) == [1, 2, 3, 4]  # steps 3 and 4 written after 1 and 2, once each
    carried = {i: (s, f) for i, s, f in zip(*resumed["4"].values(), strict=True)}
    # rows explored at steps 1-2 only keep exactly the counts learned then
    only_early = [i for i in learned["indices"] if i not in late[3] | late[4]]
    assert only_early
    for i, s, f in zip(*learned.values(), strict=True):
        if i in only_early:
            assert carried[i] == (s, f)
