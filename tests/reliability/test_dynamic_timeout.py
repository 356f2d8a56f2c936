"""explorer.dynamic_timeout on a whole run: a workflow that sleeps for an hour is cut at a few
times the mean time of the tasks that succeeded, not at ``explorer.max_timeout``."""

import re

from tests.reliability.conftest import BASE_CONFIG
from tests.reliability.test_faults import PLUGINS, overrides, records
from trinity.runtime.launcher import run


def test_a_hanging_workflow_is_cut_by_the_dynamic_timeout(
    tmp_path, micro_model, arithmetic_data, ray_cluster, capsys
):
    # hanging_workflow: row 0 sleeps 3600 s on every attempt; the other rows finish at once.
    # With max_timeout 3000 s the run could only end this side of an hour by the dynamic
    # limit (3 x the mean of the successes so far), applied to a task sent before any success.
    args = overrides(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.default_workflow_type=hanging_workflow",
        "buffer.total_steps=1",
        "explorer.max_timeout=3000",
        "explorer.max_retry_times=0",
        "explorer.dynamic_timeout.enable=true",
        "explorer.dynamic_timeout.ratio=3",
    )
    (result,) = run(BASE_CONFIG, args, [PLUGINS])
    out = capsys.readouterr().out
    assert "train-1-arith_train-0" in out and "(explorer.dynamic_timeout: 3 x" in out
    # cut once the successes so far (1 to 3 of rows 1-3: one runner runs them in turn; how
    # many have ended when the limit is checked depends on the machine's load) make the
    # limit shorter than row 0 has been running
    assert re.search(r"the mean time of [123] successful task\(s\) like it", out)
    trainer = records(result.job_dir, "trainer")
    assert [r["sample/experience_count"] for r in trainer] == [12]  # rows 1-3, 4 rollouts each
