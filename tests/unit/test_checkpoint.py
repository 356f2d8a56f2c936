import os

import torch

from trinity.trainer import checkpoint as ckpt


def test_save_load_and_rotation(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3):
        ckpt.save_checkpoint(str(tmp_path), step, model, {"o": step}, {"k": step}, max_to_keep=2)
    assert ckpt.latest_step(str(tmp_path)) == 3
    assert sorted(os.listdir(tmp_path)) == [
        "global_step_2",
        "global_step_3",
        "latest_checkpointed_iteration.txt",
    ]
    state = ckpt.load_checkpoint(str(tmp_path), 3)
    assert state["extra"] == {"step": 3, "k": 3} and state["optim"] == {"o": 3}
    assert torch.equal(state["model"]["weight"], model.weight.detach())


def test_no_checkpoint(tmp_path):
    assert ckpt.latest_step(str(tmp_path)) is None
