"""A taskset's own repeat_times decides how many experiences an explore step makes: the
default train_batch_size, a runner's slots and the planned train steps all follow it."""

import json

from trinity.common.config import load_config
from trinity.common.config.config import rollouts_per_step
from trinity.preflight.derive import finalize, planned_steps
from trinity.runtime.explorer_role import runner_slots

CONFIG = """
model: {{model_path: /m, max_prompt_tokens: 16, max_response_tokens: 8}}
algorithm: {{algorithm_type: grpo, repeat_times: 8}}
buffer:
  batch_size: 4
  total_epochs: 1
  explorer_input:
    taskset:
      path: {data}
      format: {{prompt_key: q, response_key: a}}
      {own}
explorer: {{concurrent_mode: multi-threading}}
"""


def stage(tmp_path, own: str = ""):
    data = tmp_path / "tasks"
    data.mkdir(exist_ok=True)
    with open(data / "train.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"q": f"{i} + 1 =", "a": str(i + 1)}) + "\n")
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.format(data=data, own=own))
    return finalize(load_config(str(path)))


def test_without_its_own_repeat_times_the_algorithms_counts(tmp_path):
    config = stage(tmp_path)
    assert rollouts_per_step(config) == 4 * 8 == config.buffer.train_batch_size
    assert planned_steps(config) == 10  # 40 tasks / 4 per step, one train step each


def test_a_tasksets_own_repeat_times_decides(tmp_path):
    config = stage(tmp_path, own="repeat_times: 2")
    # 4 tasks x 2 rollouts, not 4 x algorithm.repeat_times 8
    assert rollouts_per_step(config) == 8 == config.buffer.train_batch_size
    assert runner_slots(config, runners=2) == 4
    assert planned_steps(config) == 10


def test_a_smaller_train_batch_makes_more_train_steps(tmp_path):
    config = stage(tmp_path, own="repeat_times: 2")
    config.buffer.train_batch_size = 4  # half of what an explore step makes
    assert planned_steps(config) == 20


def test_the_steps_are_counted_from_the_rows_the_checks_read(tmp_path, monkeypatch):
    """The data check before start reads the taskset; planned_steps then gets its rows from
    the reader's cache instead of reading the file again."""
    from trinity.buffer import file_reader
    from trinity.preflight.before_start import _data_problems

    reads = []
    original = file_reader._load

    def counted(*args, **kwargs):
        reads.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(file_reader, "_load", counted)
    monkeypatch.setattr(file_reader, "_CACHE", type(file_reader._CACHE)())
    config = stage(tmp_path)
    assert reads == []  # deriving reads no data
    assert _data_problems(config) == [] and len(reads) == 1  # the check before start
    assert planned_steps(config) == 10 and len(reads) == 1  # counted from the same rows
