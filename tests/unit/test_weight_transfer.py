"""The ``nccl`` weight sync (trinity/common/weight_transfer.py) over gloo on CPU: the same code
NCCL runs between GPUs. Trainer and engines are threads of this process here, each with its
own end of the group, as they are processes of their own in a run."""

import asyncio
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.common.weight_transfer import (
    ALIGN,
    WeightReceiver,
    WeightSender,
    plan_layout,
    unheld,
)
from trinity.common.weights import SyncTimeoutError, WeightSyncError, tensor_stats
from trinity.engine.transformers_model import TransformersInferenceModel


def test_layout_bounds_buckets_aligns_tensors_and_sends_tied_weights_once():
    embed = torch.zeros(10, 4)
    tensors = {"embed": embed, "norm": torch.zeros(4), "head": embed, "big": torch.zeros(300)}
    layout = plan_layout(tensors, torch.bfloat16, bucket_bytes=256)
    assert layout["aliases"] == {"head": "embed"}
    placed = [entry for bucket in layout["buckets"] for entry in bucket["tensors"]]
    assert [entry[0] for entry in placed] == ["embed", "norm", "big"]
    assert all(entry[2] == "bfloat16" and entry[3] % ALIGN == 0 for entry in placed)
    # embed (80 bytes, padded to 128) and norm (8) share a bucket; big (600) has its own
    assert [[e[0] for e in b["tensors"]] for b in layout["buckets"]] == [["embed", "norm"], ["big"]]
    assert layout["buckets"][1]["bytes"] >= 600
    # integer tensors keep their dtype; None keeps every tensor's own
    kept = plan_layout({"ids": torch.zeros(3, dtype=torch.long)}, torch.bfloat16, 128)
    assert kept["buckets"][0]["tensors"][0][2] == "int64"


def _engines(model_path, count):
    return [
        TransformersInferenceModel(
            model_path=model_path, max_model_len=64, max_prompt_tokens=48, max_response_tokens=4
        )
        for _ in range(count)
    ]


def _sync(sender, engines, version, state):
    """Send ``state`` as ``version`` while every engine loads it, as in a run."""
    errors = []

    def load(index, engine):
        try:
            asyncio.run(engine.load_weights(sender.offer.for_engine(index), version))
        except Exception as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(i, e)) for i, e in enumerate(engines)]
    for thread in threads:
        thread.start()
    try:
        sender.send(version, state)
    finally:
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]


def _same_weights(engine, state):
    held = engine.engine.model.state_dict()
    return all(torch.equal(held[name], tensor) for name, tensor in state.items())


def test_engines_hold_the_trainers_weights_after_each_sync(micro_model):
    """Two engines, small buckets (many broadcasts); a second sync after an optimizer step
    changed every weight: the engines hold the trainer's values each time (checked by the
    engines against the trainer's checksums, and here tensor by tensor)."""
    torch.manual_seed(1)  # other values than the engines' folder: the first sync changes them
    trainer = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32)
    for param in trainer.parameters():
        torch.nn.init.normal_(param, std=0.05)
    engines = _engines(micro_model, 2)
    sender = WeightSender("127.0.0.1", 2, "gloo", 30.0, torch.float32, bucket_bytes=64 * 1024)
    assert not _same_weights(engines[0], trainer.state_dict())

    _sync(sender, engines, 1, trainer.state_dict())
    assert all(_same_weights(engine, trainer.state_dict()) for engine in engines)

    optimizer = torch.optim.AdamW(trainer.parameters(), lr=1e-2)
    trainer(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    assert not _same_weights(engines[0], trainer.state_dict())
    _sync(sender, engines, 2, trainer.state_dict())
    assert all(_same_weights(engine, trainer.state_dict()) for engine in engines)
    assert [asyncio.run(engine.model_version()) for engine in engines] == [2, 2]


def test_an_engine_that_did_not_load_what_was_sent_fails_naming_the_tensor(micro_model):
    (engine,) = _engines(micro_model, 1)
    sender = WeightSender("127.0.0.1", 1, "gloo", 30.0, torch.float32)
    state = {name: t + 1.0 for name, t in engine.engine.model.state_dict().items()}
    skipped = "model.norm.weight"
    load = engine.engine.load_state_dict
    engine.engine.load_state_dict = lambda tensors: load(
        {name: t for name, t in tensors.items() if name != skipped}
    )
    with pytest.raises(WeightSyncError, match=skipped):
        _sync(sender, [engine], 1, state)
    assert asyncio.run(engine.model_version()) == 0  # the version is not recorded


def test_bf16_engines_are_sent_bf16_and_checked_against_the_sums_as_sent():
    sender = WeightSender("127.0.0.1", 1, "gloo", 30.0, torch.bfloat16)
    state = {"w": torch.randn(5, 3), "b": torch.randn(7)}
    got = {}
    receiver = WeightReceiver(sender.offer.for_engine(0))
    thread = threading.Thread(
        target=lambda: got.update(
            sums=receiver.receive(1, lambda t: got.update({k: v.clone() for k, v in t.items()}))
        )
    )
    thread.start()
    sender.send(1, state)
    thread.join()
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], state["w"].bfloat16())
    assert got["sums"]["w"] == tensor_stats(state["w"].bfloat16())
    assert unheld(got["sums"], {"w": got["w"], "b": got["b"]}) == []
    assert unheld(got["sums"], {"w": got["w"], "b": got["b"] * 2}) == ["b"]


def test_an_engine_that_never_arrives_fails_the_trainer_naming_it():
    sender = WeightSender("127.0.0.1", 2, "gloo", 1.5)
    receiver = WeightReceiver(sender.offer.for_engine(0))  # engine 1 never comes
    thread = threading.Thread(target=_ignore_failure(receiver.receive, 1, lambda t: None))
    thread.start()
    start = time.monotonic()
    with pytest.raises(SyncTimeoutError) as caught:
        sender.send(1, {"w": torch.randn(4)})
    assert time.monotonic() - start < 1.5 + 1.0
    thread.join()
    message = str(caught.value)
    assert "rollout engine 1 did not join the transfer of model version 1" in message
    assert "synchronizer.sync_timeout=1.5s" in message and "engine 0" not in message


def test_a_trainer_that_never_sends_fails_the_engine_naming_it():
    sender = WeightSender("127.0.0.1", 1, "gloo", 1.5)  # publishes, then never sends
    receiver = WeightReceiver(sender.offer.for_engine(0))
    start = time.monotonic()
    with pytest.raises(SyncTimeoutError) as caught:
        receiver.receive(3, lambda t: None)
    assert time.monotonic() - start < 1.5 + 1.0
    assert str(caught.value).startswith(
        f"the trainer (rank 0 of the weight sync at 127.0.0.1:{sender.offer.port}) did not "
        "describe model version 3 within synchronizer.sync_timeout=1.5s"
    )


def _ignore_failure(fn, *args):
    def run():
        try:
            fn(*args)
        except SyncTimeoutError:  # this side times out too once the trainer gave up
            pass

    return run
