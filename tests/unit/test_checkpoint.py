import errno
import json
import os
import textwrap
from types import SimpleNamespace

import pytest
import torch

from trinity.algorithm.optimizer import build_lr_scheduler, build_optimizer
from trinity.common.weights import saved_steps, weights_path
from trinity.preflight.derive import finalize
from trinity.trainer import checkpoint as ckpt


class TiedLM(torch.nn.Module):
    """Embedding and output head share one weight, as in the tiny models."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.mid = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.embed(ids))))


def _listing(job_dir) -> list:
    return sorted(os.listdir(job_dir))


def test_save_load_and_rotation(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3):
        ckpt.save_checkpoint(str(tmp_path), step, model, {"o": step}, {"k": step}, max_to_keep=2)
    assert ckpt.latest_step(str(tmp_path)) == 3
    assert _listing(tmp_path) == [
        "global_step_2",
        "global_step_3",
        "latest_checkpointed_iteration.txt",
    ]
    assert sorted(os.listdir(tmp_path / "global_step_3" / "actor")) == [
        "model.safetensors",
        "optim.pt",
    ]
    state = ckpt.load_checkpoint(str(tmp_path), 3)
    checkpoint_id = state["extra"].pop(ckpt.CHECKPOINT_ID_KEY)  # random, one per checkpoint
    assert len(checkpoint_id) == 32
    assert state["extra"] == {"step": 3, "k": 3} and state["optim"] == {"o": 3}
    assert torch.equal(state["model"]["weight"], model.weight.detach())
    assert weights_path(str(tmp_path), 3).endswith("global_step_3/actor/model.safetensors")


def test_no_checkpoint(tmp_path):
    assert ckpt.latest_step(str(tmp_path)) is None


def test_tied_weights_are_stored_once_and_retied(tmp_path):
    model = TiedLM()
    path = str(tmp_path / "w.safetensors")
    ckpt.save_weights(model.state_dict(), path)
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        stored = set(f.keys())
    assert stored == {"embed.weight", "mid.weight", "mid.bias"}  # head.weight is an alias
    loaded = ckpt.load_weights(path)
    assert set(loaded) == set(model.state_dict())
    assert loaded["head.weight"] is loaded["embed.weight"]
    fresh = TiedLM()
    fresh.load_state_dict(loaded)  # strict: every name is there
    assert torch.equal(fresh.head.weight, model.embed.weight)


def _train(model, optimizer, scheduler, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 5, (4, 6), generator=gen)
        optimizer.zero_grad()
        model(ids).logsumexp(-1).mean().backward()
        optimizer.step()
        scheduler.step()


def test_resume_round_trip_restores_weights_optimizer_and_scheduler_exactly(tmp_path):
    cfg = SimpleNamespace(
        optimizer_type="adamw",
        lr=1e-2,
        betas=(0.9, 0.99),
        weight_decay=0.01,
        lr_warmup_steps=2,
        lr_warmup_steps_ratio=0.0,
        lr_scheduler_type="cosine",
        min_lr_ratio=0.1,
        num_cycles=0.5,
    )

    def build():
        torch.manual_seed(0)
        model = TiedLM()
        optimizer = build_optimizer(model.parameters(), cfg)
        return model, optimizer, build_lr_scheduler(optimizer, cfg, 10)

    model, optimizer, scheduler = build()
    _train(model, optimizer, scheduler, steps=3, seed=1)
    optim_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    ckpt.save_checkpoint(str(tmp_path), 3, model, optim_state, {"kl": 0.5})

    model2, optimizer2, scheduler2 = build()  # fresh init, then resume
    state = ckpt.load_checkpoint(str(tmp_path), 3)
    model2.load_state_dict(state["model"])
    optimizer2.load_state_dict(state["optim"]["optimizer"])
    scheduler2.load_state_dict(state["optim"]["scheduler"])
    assert model2.head.weight is model2.embed.weight  # still tied after loading
    assert scheduler2.last_epoch == 3 and scheduler2.get_last_lr() == scheduler.get_last_lr()

    # The next steps of the resumed copy are bit-identical to the uninterrupted run.
    _train(model, optimizer, scheduler, steps=2, seed=2)
    _train(model2, optimizer2, scheduler2, steps=2, seed=2)
    for (name, a), (_, b) in zip(
        model.state_dict().items(), model2.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    for a, b in zip(optimizer.state.values(), optimizer2.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))


def _disk_full_after_weights(monkeypatch):
    """Make the first torch-format file (optim.pt, written after the weights) hit ENOSPC."""

    def full(obj, path):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(ckpt, "_save_torch", full)


def test_disk_full_mid_save_keeps_previous_checkpoint_and_marker(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    ckpt.save_checkpoint(str(tmp_path), 8, model, {"o": 8}, {})
    before = _listing(tmp_path)
    _disk_full_after_weights(monkeypatch)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.save_checkpoint(str(tmp_path), 12, model, {"o": 12}, {}, max_to_keep=1)
    message = str(info.value)
    assert message.startswith("disk full while writing checkpoint step 12 to ")
    assert "global_step_12: free space and resume" in message
    assert message.endswith("the previous checkpoint (step 8) is intact")
    assert isinstance(info.value.__cause__, OSError)
    assert _listing(tmp_path) == before  # no temp folder, no step 12, marker unchanged
    assert ckpt.latest_step(str(tmp_path)) == 8
    assert ckpt.load_checkpoint(str(tmp_path), 8)["optim"] == {"o": 8}


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.EROFS, "read-only file system while writing checkpoint step 1"),
        (errno.EIO, "disk I/O error while writing checkpoint step 1"),
        (errno.EDQUOT, "disk quota exceeded while writing checkpoint step 1"),
    ],
)
def test_disk_errors_are_named_in_words(tmp_path, monkeypatch, code, words):
    def fail(tensors, path, metadata=None):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("safetensors.torch.save_file", fail)  # save_weights imports it late
    with pytest.raises(ckpt.CheckpointError, match=words) as info:
        ckpt.save_checkpoint(str(tmp_path), 1, torch.nn.Linear(2, 2), {}, {})
    assert str(info.value).endswith("no earlier checkpoint exists")
    assert os.listdir(tmp_path) == []


def test_a_full_disk_under_torch_save_is_enospc_not_a_zip_position(tmp_path, monkeypatch):
    # torch.save to a path reports a full disk as "unexpected pos N vs M"; through our
    # writer the OSError of the short write comes out as it is.
    real_write = os.write
    calls = []

    def short_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))  # the disk takes half
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt.os, "write", short_then_full)
    with pytest.raises(OSError) as info:
        ckpt._save_torch({"w": torch.zeros(100_000)}, str(tmp_path / "x.pt"))
    assert info.value.errno == errno.ENOSPC
    assert calls[1] == calls[0] - calls[0] // 2  # the rest of the short write was retried


def test_safetensors_io_errors_keep_their_errno():
    from safetensors import SafetensorError

    err = ckpt.as_os_error(
        SafetensorError("Error while serializing: I/O error: No space left (os error 28)")
    )
    assert err.errno == errno.ENOSPC


def test_leftover_temp_folder_of_a_killed_save_is_ignored_and_removed(tmp_path):
    model = torch.nn.Linear(2, 2)
    ckpt.save_checkpoint(str(tmp_path), 1, model, {}, {})
    leftover = tmp_path / "global_step_2.tmp-99999"  # a save killed before its rename
    (leftover / "actor").mkdir(parents=True)
    (leftover / "actor" / "model.safetensors").write_bytes(b"half")
    (tmp_path / "latest_checkpointed_iteration.txt.tmp").write_text("2")
    assert ckpt.latest_step(str(tmp_path)) == 1
    assert saved_steps(str(tmp_path)) == [1]
    ckpt.save_checkpoint(str(tmp_path), 3, model, {}, {})
    assert _listing(tmp_path) == [
        "global_step_1",
        "global_step_3",
        "latest_checkpointed_iteration.txt",
    ]


def test_an_unmarked_folder_of_the_same_step_is_replaced(tmp_path):
    # A run killed after renaming step 2 but before writing the marker, then resumed from 1.
    model = torch.nn.Linear(2, 2)
    ckpt.save_checkpoint(str(tmp_path), 1, model, {"o": 1}, {})
    stale = tmp_path / "global_step_2"
    (stale / "actor").mkdir(parents=True)
    (stale / "stale.txt").write_text("old run")
    ckpt.save_checkpoint(str(tmp_path), 2, model, {"o": 2}, {})
    assert not (stale / "stale.txt").exists()
    assert ckpt.load_checkpoint(str(tmp_path), 2)["optim"] == {"o": 2}


@pytest.mark.parametrize("keep, left", [(None, [1, 2, 3, 4]), (2, [3, 4]), (0, [4]), (-1, [4])])
def test_retention_never_deletes_the_new_checkpoint(tmp_path, keep, left):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(str(tmp_path), step, model, {}, {}, max_to_keep=keep)
    assert saved_steps(str(tmp_path)) == left
    assert ckpt.latest_step(str(tmp_path)) == 4
    ckpt.load_checkpoint(str(tmp_path), 4)


def test_retention_keeps_the_marked_step_and_later_folders(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3, 5):
        ckpt.save_checkpoint(str(tmp_path), step, model, {}, {})
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    assert ckpt.apply_retention(str(tmp_path), 3, max_to_keep=1) == [1]
    assert saved_steps(str(tmp_path)) == [2, 3, 5]


class _Payload:
    """Unpickling this creates a file: proof that loading ran code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickled_object_in_a_checkpoint_is_refused(tmp_path):
    model = torch.nn.Linear(2, 2)
    ckpt.save_checkpoint(str(tmp_path), 1, model, {"o": 1}, {})
    marker = tmp_path / "code_ran"
    for name in ("actor/optim.pt", "critic.pt"):
        target = tmp_path / "global_step_1" / name
        torch.save({"state": _Payload(str(marker))}, target)
        with pytest.raises(ckpt.CheckpointError, match="refusing to load it"):
            ckpt.load_checkpoint(str(tmp_path), 1)
        assert not marker.exists()
        torch.save({"o": 1}, target)


def test_a_checkpoint_missing_files_is_named(tmp_path):
    ckpt.save_checkpoint(str(tmp_path), 4, torch.nn.Linear(2, 2), {}, {})
    os.remove(tmp_path / "global_step_4" / "actor" / "optim.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"global_step_4 is incomplete: actor/optim.pt"):
        ckpt.load_checkpoint(str(tmp_path), 4)
    (tmp_path / "global_step_4" / "actor" / "optim.pt").write_bytes(b"PK\x03\x04trunc")
    with pytest.raises(ckpt.CheckpointError, match="optim.pt is damaged"):
        ckpt.load_checkpoint(str(tmp_path), 4)
    (tmp_path / "global_step_4" / "actor" / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(ckpt.CheckpointError, match="not a readable safetensors"):
        ckpt.load_weights(weights_path(str(tmp_path), 4))


CONFIG = """
project: tests
name: ckpt
checkpoint_root_dir: {root}
continue_from_checkpoint: true
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 4}}
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
buffer:
  batch_size: 2
  total_steps: 4
  explorer_input:
    default_workflow_type: math_workflow
    taskset: {{name: train, path: {data}, split: train,
               format: {{prompt_key: question, response_key: answer}}}}
"""


def _trainer(tmp_path, micro_model, arithmetic_data):
    from trinity.common.config import load_config
    from trinity.trainer.trainer import Trainer

    path = tmp_path / "config.yaml"
    text = CONFIG.format(root=tmp_path, model=micro_model, data=arithmetic_data["rl"])
    path.write_text(textwrap.dedent(text))
    config = finalize(load_config(str(path)))
    trainer = Trainer(config, planned_steps=4, log=lambda metrics, step: None)
    trainer.prepare_model()
    trainer.attach_reader(reader=None)  # the default strategy only reads in sample()
    return trainer


def test_trainer_save_and_resume(tmp_path, micro_model, arithmetic_data):
    from trinity.common.experience import Experience

    trainer = _trainer(tmp_path, micro_model, arithmetic_data)
    prompt = trainer.tokenizer.encode("1+1=")
    exps = [
        Experience(
            tokens=prompt + trainer.tokenizer.encode(answer),
            prompt_length=len(prompt),
            reward=reward,
            logprobs=[-1.0] * len(answer),
            group_id="g",
        )
        for answer, reward in (("2", 1.0), ("3", 0.0))
    ]
    trainer.step = 1
    trainer.train_step(exps)
    trainer.save(final=True)  # save_hf_checkpoint defaults to "last": writes hf/ too
    job = trainer.job_dir
    assert sorted(os.listdir(os.path.join(job, "global_step_1"))) == [
        "actor",
        "extra.json",
        "hf",
    ]
    with open(os.path.join(job, "global_step_1", "extra.json")) as f:
        assert json.load(f)["step"] == 1

    resumed = _trainer(tmp_path, micro_model, arithmetic_data)
    assert resumed.step == 1
    for (name, a), (_, b) in zip(
        trainer.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert resumed.scheduler.state_dict() == trainer.scheduler.state_dict()
    saved, loaded = trainer.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    for key, value in saved["state"].items():
        assert all(torch.equal(value[k], loaded["state"][key][k]) for k in value)


def test_trainer_hf_export_disk_full_cleans_up(tmp_path, micro_model, arithmetic_data, monkeypatch):
    trainer = _trainer(tmp_path, micro_model, arithmetic_data)
    trainer.step = 2
    out = os.path.join(tmp_path, "hf")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(trainer.tokenizer, "save_pretrained", full)
    with pytest.raises(ckpt.CheckpointError, match="disk full while writing the Hugging Face"):
        trainer.export_hf(out)
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")


class _Killed(BaseException):
    """Stands for a kill -9 between a step's checkpoint and its metrics record."""


def test_a_step_checkpointed_by_its_publish_keeps_its_metrics_for_the_resumed_run(
    tmp_path, micro_model, arithmetic_data
):
    from trinity.common.experience import Experience
    from trinity.monitor import Monitor

    trainer = _trainer(tmp_path, micro_model, arithmetic_data)
    prompt = trainer.tokenizer.encode("1+1=")

    class Rows:  # one GRPO group per read
        def read(self, n, timeout=None):
            return [
                Experience(
                    tokens=prompt + trainer.tokenizer.encode(answer),
                    prompt_length=len(prompt),
                    reward=reward,
                    logprobs=[-1.0] * len(trainer.tokenizer.encode(answer)),
                    group_id="g",
                )
                for answer, reward in (("2", 1.0), ("3", 0.0))
            ]

    logged = {}

    def log(metrics, step):
        if step == 2:  # the checkpoint of step 2 is on disk, its record is not
            raise _Killed
        logged[step] = dict(metrics)

    trainer.attach_reader(Rows())
    trainer.log = log
    trainer.publish = lambda version, model: trainer.save(final=False)  # sync by checkpoint
    trainer.publish_due = lambda step: True
    with pytest.raises(_Killed):
        trainer.run()
    assert sorted(logged) == [1]

    resumed = _trainer(tmp_path, micro_model, arithmetic_data)
    assert resumed.step == 2
    # the metrics of step 2 as the killed run computed them, before its publish was timed
    assert resumed.unlogged["sample/experience_count"] == 2
    assert "actor/pg_loss" in resumed.unlogged and "time/sync_weights" not in resumed.unlogged
    with open(os.path.join(trainer.job_dir, "global_step_1", "extra.json")) as f:
        saved = json.load(f)["unlogged_metrics"]  # each publish saves before it logs
    assert saved["actor/pg_loss"] == logged[1]["actor/pg_loss"]
    # what the trainer role asks before logging them again (only step 1 was logged)
    monitor = Monitor(trainer.job_dir, "p", "n", "trainer", "tensorboard", {}, keep_until=2)
    monitor.log(logged[1], 1)
    assert monitor.has_logged(1) and not monitor.has_logged(2)
    monitor.close()
