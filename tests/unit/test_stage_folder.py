"""A stage's folder before it runs: moved aside when it was trained from other starting
weights, left alone otherwise; finished, or past the steps asked for (stage_folder.py)."""

import os
from types import SimpleNamespace

import pytest
import torch

from trinity.runtime.failures import RunFailed
from trinity.runtime.stage_folder import (
    finished_weights,
    prepare_folder,
    read_start,
    same_weights,
    weights_origin,
    write_start,
)
from trinity.trainer import checkpoint as ckpt


def stage(job_dir, mode="both", path=None, storage_type="queue", resumes=True):
    storage = SimpleNamespace(path=path, storage_type=storage_type)
    return SimpleNamespace(
        name="run_rl",
        mode=mode,
        checkpoint_job_dir=str(job_dir),
        continue_from_checkpoint=resumes,
        buffer=SimpleNamespace(trainer_input=SimpleNamespace(experience_buffer=storage)),
    )


def save(job_dir, step, hf=True):
    ckpt.save_checkpoint(str(job_dir), step, torch.nn.Linear(1, 1), {}, {})
    if hf:
        os.makedirs(os.path.join(job_dir, f"global_step_{step}", "hf"))


def test_each_checkpoint_gets_its_own_id(tmp_path):
    save(tmp_path / "sft", 2)
    first = weights_origin(str(tmp_path / "sft"))
    save(tmp_path / "again" / "sft", 2)  # a stage run over to the same step
    again = weights_origin(str(tmp_path / "again" / "sft"))
    assert first["step"] == again["step"] == 2
    assert first["checkpoint_id"] and not same_weights(first, again)
    # without ids (a checkpoint of an earlier version): folder and step decide
    assert same_weights({**first, "checkpoint_id": None}, first)
    assert not same_weights({**first, "checkpoint_id": None, "step": 3}, first)


def test_a_killed_stage_whose_start_changed_is_moved_aside_and_starts_fresh(tmp_path):
    """Killed (kill -9) before its first checkpoint: the record written before its roles
    started still says which weights its rows and metrics came from."""
    save(tmp_path / "sft", 2)
    rl = tmp_path / "rl"
    write_start(str(rl), weights_origin(str(tmp_path / "sft")))
    (rl / "monitor").mkdir()
    (rl / "monitor" / "explorer.jsonl").write_text('{"step": 1}\n')
    save(tmp_path / "sft", 375)
    said = []
    prepare_folder(stage(rl), weights_origin(str(tmp_path / "sft")), said.append)
    (moved,) = [d for d in os.listdir(tmp_path) if d.startswith("rl.old-")]
    assert said == [
        "stage run_rl: its folder was trained from sft's step 2, and sft now ends at step 375: "
        f"starting it fresh from those weights; the old folder is kept as {tmp_path / moved}"
    ]
    assert os.listdir(rl) == ["start_weights.json"] and read_start(str(rl))["step"] == 375
    assert os.path.isfile(tmp_path / moved / "monitor" / "explorer.jsonl")


def test_a_stage_from_the_same_weights_resumes_untouched(tmp_path):
    save(tmp_path / "sft", 2)
    origin = weights_origin(str(tmp_path / "sft"))
    write_start(str(tmp_path / "rl"), origin)
    save(tmp_path / "rl", 5)
    said = []
    prepare_folder(stage(tmp_path / "rl"), origin, said.append)
    assert said == [] and sorted(os.listdir(tmp_path)) == ["rl", "sft"]
    # a folder without the record (an earlier version) cannot tell: it resumes as before
    os.remove(tmp_path / "rl" / "start_weights.json")
    save(tmp_path / "sft", 3)
    prepare_folder(stage(tmp_path / "rl"), weights_origin(str(tmp_path / "sft")), said.append)
    assert said == [] and read_start(str(tmp_path / "rl")) is None


@pytest.mark.parametrize(
    ("mode", "path", "storage_type", "why"),
    [
        ("both", "postgresql://db/exps", "queue", "its experience buffer (postgresql://db/exps)"),
        ("both", "/elsewhere/buffer.db", "queue", "its experience buffer (/elsewhere/buffer.db)"),
        ("train", "sqlite:///store.db", "sql", "a separate explore run writes its experiences"),
    ],
)
def test_state_outside_the_folder_is_refused_not_left_behind(
    tmp_path, mode, path, storage_type, why
):
    save(tmp_path / "sft", 2)
    write_start(str(tmp_path / "rl"), weights_origin(str(tmp_path / "sft")))
    save(tmp_path / "sft", 3)
    config = stage(tmp_path / "rl", mode, path, storage_type)
    with pytest.raises(RunFailed, match="stage run_rl: its folder .* was trained from") as info:
        prepare_folder(config, weights_origin(str(tmp_path / "sft")), print)
    assert why in str(info.value) and "give the run another name (name=...)" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["rl", "sft"]


def test_a_buffer_file_inside_the_folder_moves_with_it(tmp_path):
    save(tmp_path / "sft", 2)
    write_start(str(tmp_path / "rl"), weights_origin(str(tmp_path / "sft")))
    save(tmp_path / "sft", 3)
    inside = f"sqlite:///{tmp_path / 'rl' / 'mine.db'}"
    prepare_folder(
        stage(tmp_path / "rl", path=inside), weights_origin(str(tmp_path / "sft")), print
    )
    assert any(d.startswith("rl.old-") for d in os.listdir(tmp_path))


def test_finished_past_and_unfinished_stages(tmp_path):
    job = tmp_path / "sft"
    save(job, 2)
    assert finished_weights(stage(job, "train"), 3) is None  # one step to go
    assert finished_weights(stage(job, "train"), 2) == str(job / "global_step_2" / "hf")
    assert finished_weights(stage(job, "explore"), 2) is None  # no trainer: never "finished"
    assert finished_weights(stage(job, "train", resumes=False), 2) is None
    with pytest.raises(RunFailed) as info:
        finished_weights(stage(job, "train"), 1)
    assert str(info.value).startswith(
        f"stage run_rl: the run in {job} is already past step 1 (it stopped at step 2); "
    )
    save(tmp_path / "lora", 4)
    os.makedirs(tmp_path / "lora" / "global_step_4" / "hf" / "merged")
    merged = str(tmp_path / "lora" / "global_step_4" / "hf" / "merged")
    assert finished_weights(stage(tmp_path / "lora", "both"), 4) == merged
