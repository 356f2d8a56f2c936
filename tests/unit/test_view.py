"""trinity view: a run's experience buffer listed and filtered, one row shown; read-only."""

import os

import torch
import yaml
from typer.testing import CliRunner

from trinity.buffer.store import SQLExperienceStore
from trinity.cli.main import app
from trinity.common.experience import Experience


def exp(group, reward, version=0):
    return Experience(
        tokens=torch.tensor([5, 6, 7, 8]),
        prompt_length=2,
        reward=reward,
        logprobs=torch.tensor([-0.5, -1.5]),
        action_mask=torch.tensor([1, 1]),
        group_id=group,
        model_version=version,
        prompt_text="2+2=",
        response_text="4",
    )


def make_run(job_dir, model_path="/gone/model", store_path=None, config_names=("config.yaml",)):
    os.makedirs(job_dir)
    config = {
        "model": {"model_path": model_path},
        "buffer": {"trainer_input": {"experience_buffer": {"name": "exps", "path": store_path}}},
    }
    for name in config_names:
        with open(os.path.join(job_dir, name), "w") as f:
            yaml.safe_dump(config, f)
    store = SQLExperienceStore(store_path or os.path.join(job_dir, "buffer", "exps.db"), "exps")
    ids = store.add([exp("train-1-a-0", 1.0), exp("train-1-a-0", 0.0)], step=1)
    store.add([exp("train-2-a-1", 0.5, 1), exp("train-2-b-0", -1.0, 1)], step=2)
    store.mark_consumed(ids, by_step=1)
    store.close()


def view(*args):
    return CliRunner().invoke(app, ["view", *map(str, args)])


def test_rows_are_listed_with_step_task_reward_and_reader(tmp_path):
    make_run(tmp_path / "run")
    result = view(tmp_path / "run")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "train-" in line]
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in lines]
    assert cells == [
        ["1", "1", "train-1-a-0", "1.0", "0", "1"],
        ["2", "1", "train-1-a-0", "0.0", "0", "1"],
        ["3", "2", "train-2-a-1", "0.5", "1", "-"],
        ["4", "2", "train-2-b-0", "-1.0", "1", "-"],
    ]
    assert "4 of 4 matching row(s)" in result.output


def test_filters_by_step_task_and_reward(tmp_path):
    make_run(tmp_path / "run")
    assert "2 of 2 matching" in view(tmp_path / "run", "--step", 2).output
    assert "1 of 1 matching" in view(tmp_path / "run", "--task", "train-2-b-0").output
    out = view(tmp_path / "run", "--min-reward", 0.0, "--max-reward", 0.5).output
    assert "2 of 2 matching" in out and "train-2-b-0" not in out
    assert "1 of 4 matching" in view(tmp_path / "run", "--limit", 1).output


def test_one_row_shown_whole_without_the_tokenizer(tmp_path):
    make_run(tmp_path / "run")
    result = view(tmp_path / "run", "--show", 3)
    assert result.exit_code == 0, result.output
    assert "prompt: '2+2='" in result.output and "response: '4'" in result.output
    assert "reward: 0.5" in result.output
    missing = view(tmp_path / "run", "--show", 99)
    assert missing.exit_code == 2
    # one clean line, not a KeyError's repr in quotes
    assert missing.output.strip().splitlines() == [
        f"error: no row 99 in sqlite:///{tmp_path / 'run' / 'buffer' / 'exps.db'} (table 'exps')"
    ]


def test_one_row_shown_as_tokens_with_the_runs_tokenizer(tmp_path, micro_model):
    make_run(tmp_path / "run", micro_model)
    result = view(tmp_path / "run", "--show", 1)
    assert result.exit_code == 0, result.output
    assert "tokens    4 = 2 prompt + 2 response, 2 trained on" in result.output
    assert "logprobs  mean -1.000 over trained tokens, min -1.500" in result.output


def test_nothing_is_created_where_there_is_no_buffer(tmp_path):
    os.makedirs(tmp_path / "empty")
    with open(tmp_path / "empty" / "config.yaml", "w") as f:
        f.write("buffer: {}\n")
    result = view(tmp_path / "empty")
    assert result.exit_code == 2
    assert "no experience buffer database at" in result.output
    assert not os.path.exists(tmp_path / "empty" / "buffer")
    assert view(tmp_path / "nowhere").exit_code == 2


def test_a_decoupled_run_folder_is_read_from_its_train_and_explore_configs(tmp_path):
    """Each side of a decoupled run saves <mode>_config.yaml; the store they share may be
    anywhere (a database URL, or a file outside the job dir)."""
    for side in ("train", "explore"):
        store = str(tmp_path / "shared" / f"{side}.db")
        make_run(tmp_path / side, store_path=store, config_names=[f"{side}_config.yaml"])
        result = view(tmp_path / side)
        assert result.exit_code == 0, result.output
        assert "4 of 4 matching row(s)" in result.output and f"{side}.db" in result.output


def test_a_task_is_matched_by_its_whole_id_or_its_start_up_to_a_dash(tmp_path):
    """Task ids are <train|eval>-<step>-<taskset>-<index>: --task train-3 is every task of step
    3, never train-30-...; the start must end where a part of the id does."""
    os.makedirs(tmp_path / "run")
    store = SQLExperienceStore(str(tmp_path / "run" / "buffer" / "exps.db"), "exps")
    ids = [
        "train-3-arithmetic_train-34",
        "train-30-arithmetic_train-0",
        "train-3-arithmetic_train-3",
    ]
    store.add(
        [exp(i, 1.0) for i in ids] + [exp("train-3", 0.5), exp("train-3-arithmeticXtrain-1", 0)],
        step=3,
    )
    store.close()
    assert "4 of 4 matching" in view(tmp_path / "run", "--task", "train-3").output
    assert (
        "1 of 1 matching" in view(tmp_path / "run", "--task", "train-3-arithmetic_train-3").output
    )
    # "_" is a character of the id, not SQL's one-character wildcard
    assert "2 of 2 matching" in view(tmp_path / "run", "--task", "train-3-arithmetic_train").output
    assert "0 of 0 matching" in view(tmp_path / "run", "--task", "train-").output
    assert "0 of 0 matching" in view(tmp_path / "run", "--task", "train-3-arith").output


def test_step_latest_lists_the_newest_step_matching_the_other_filters(tmp_path):
    make_run(tmp_path / "run")
    latest = view(tmp_path / "run", "--step", "latest")
    assert latest.exit_code == 0, latest.output
    steps = [
        line.strip("│ ").split("│")[1].strip()
        for line in latest.output.splitlines()
        if "train-" in line
    ]
    assert steps == ["2", "2"] and "2 of 2 matching" in latest.output
    # the newest step among the rows the other filters keep
    assert (
        "2 of 2 matching" in view(tmp_path / "run", "--step", "latest", "--task", "train-1").output
    )
    assert "0 of 0 matching" in view(tmp_path / "run", "--step", "latest", "--min-reward", 5).output
    bad = view(tmp_path / "run", "--step", "last")
    assert (
        bad.exit_code == 2
        and "--step last: give an explore step (a number) or latest" in bad.output
    )


def test_a_cut_listing_says_it_is_oldest_first_and_how_to_see_the_newest(tmp_path):
    make_run(tmp_path / "run")
    cut = view(tmp_path / "run", "--limit", 2).output
    assert "2 of 4 matching" in cut and "oldest first: --step latest lists the newest step" in cut
    assert "oldest first" not in view(tmp_path / "run").output  # nothing left out
    assert "oldest first" not in view(tmp_path / "run", "--step", "latest", "--limit", 1).output


def test_a_stage_that_trains_from_a_dataset_says_so(tmp_path):
    """The quickstart's sft stage: its experience buffer is the SFT data (storage_type file)."""
    os.makedirs(tmp_path / "sft")
    data = tmp_path / "quickstart" / "data" / "sft"
    storage = {"name": "arithmetic_sft", "storage_type": "file", "path": str(data)}
    with open(tmp_path / "sft" / "config.yaml", "w") as f:
        yaml.safe_dump({"buffer": {"trainer_input": {"experience_buffer": storage}}}, f)
    result = view(tmp_path / "sft")
    assert result.exit_code == 2
    assert "this stage trains from a dataset, not from explored experiences" in result.output
    assert f"'arithmetic_sft' (file, {data})" in result.output
    assert "no experience buffer database" not in result.output
    assert not os.path.exists(tmp_path / "sft" / "buffer")


def test_a_shown_row_is_headed_with_its_own_id(tmp_path, micro_model):
    make_run(tmp_path / "run", micro_model)
    assert "experience 3 (" in view(tmp_path / "run", "--show", 3).output
    make_run(tmp_path / "gone")  # no tokenizer: the stored texts, headed the same
    assert "experience 4 (task train-2-b-0)" in view(tmp_path / "gone", "--show", 4).output


def test_off_a_terminal_rows_are_never_cut_to_80_columns(tmp_path):
    os.makedirs(tmp_path / "run")
    store = SQLExperienceStore(str(tmp_path / "run" / "buffer" / "exps.db"), "exps")
    task = "train-350-a_taskset_with_a_long_descriptive_name-12345"
    store.add([exp(task, 0.123456789)], step=350)
    store.close()
    result = view(tmp_path / "run")
    assert task in result.output and "0.123456789" in result.output


def test_on_a_terminal_the_console_keeps_the_terminals_width():
    import io

    from rich.console import Console

    from trinity.utils.console import UNLIMITED_WIDTH, output_console

    # rich's own choice on a terminal (COLUMNS, the tty's size, or 80); not compared with a
    # COLUMNS set here: a library imported by an earlier test (data_juicer) replaces
    # os.environ, and rich keeps reading the mapping it saw at import
    terminal = output_console(file=io.StringIO(), force_terminal=True)
    assert terminal.width == Console(file=io.StringIO(), force_terminal=True).width
    assert terminal.width < UNLIMITED_WIDTH
    assert output_console(file=io.StringIO()).width == UNLIMITED_WIDTH


def test_a_serve_runs_rows_show_the_reply_they_were_served_as(tmp_path):
    """mode serve: a committed reply's choices become experiences that carry the reply's id
    (and choice); the listing shows it beside the train step that read the row."""
    os.makedirs(tmp_path / "run")
    with open(tmp_path / "run" / "config.yaml", "w") as f:
        yaml.safe_dump({"buffer": {"trainer_input": {"experience_buffer": {"name": "s"}}}}, f)
    served = []
    for choice in (0, 1):
        e = exp("q7", 1.0 - choice)
        e.info.update(response_id="chatcmpl-abc", choice=choice, task_id="q7")
        served.append(e)
    store = SQLExperienceStore(str(tmp_path / "run" / "buffer" / "s.db"), "s")
    store.mark_consumed(store.add(served, step=3), by_step=2)
    store.close()
    result = view(tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "reply" in result.output
    lines = [line for line in result.output.splitlines() if "q7" in line]
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in lines]
    assert [(c[1], c[5], c[6]) for c in cells] == [
        ("3", "2", "chatcmpl-abc"),
        ("3", "2", "chatcmpl-abc#1"),
    ]
