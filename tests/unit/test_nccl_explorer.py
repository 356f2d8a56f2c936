"""The explorer's side of ``sync_method: nccl`` (trinity/runtime/engine_weights.py): the
trainer waits in its broadcast of every version it publishes, so the explorer takes each one,
also while it waits for a later version or for the trainer's end. In this process: a real
``Synchronizer`` and real engines, each on a loop of its own (as Ray actors would be), the
trainer a thread sending over gloo."""

import threading
from types import SimpleNamespace

import pytest
import torch

from trinity.common.sync_schedule import Wanted
from trinity.common.weight_transfer import WeightSender
from trinity.engine.local import LocalEngine
from trinity.runtime.explorer_role import ExplorerRole
from trinity.runtime.synchronizer import Synchronizer
from trinity.utils.loop_host import LoopHost
from trinity.utils.status import Reporter

TIMEOUT = 30.0


def explorer(engines, sync):
    """An ``ExplorerRole`` with only what ``_sync`` reads."""
    me = ExplorerRole.__new__(ExplorerRole)
    me.config = SimpleNamespace(
        mode="both",
        synchronizer=SimpleNamespace(sync_method="nccl", sync_timeout=TIMEOUT, sync_style="fixed"),
        explorer=SimpleNamespace(rollout_model=SimpleNamespace(engine_type="transformers")),
        model=SimpleNamespace(lora_configs=[]),
    )
    me.engines, me.sync_actor, me.queue, me.loaded_version = engines, sync, None, 0
    me.report = Reporter(None, "explorer")
    return me


def trainer(sync, sender, states):
    """Publish and send each state in turn (``TrainerRole._publish_collective``), then end."""
    for version, state in enumerate(states, 1):
        sync.publish(version, [sender.offer])
        sender.send(version, state)
    sync.trainer_finished()


def test_versions_published_before_the_one_waited_for_and_before_the_end_are_taken(
    micro_model, tmp_path
):
    limits = dict(max_model_len=32, max_prompt_tokens=24, max_response_tokens=4)
    engines = [
        LocalEngine("transformers", name=f"engine-{i}", model_path=micro_model, **limits)
        for i in range(2)
    ]
    sync = LoopHost(lambda: Synchronizer("nccl", str(tmp_path), TIMEOUT, True), "sync")
    base = engines[0].hosted.engine.model.state_dict()
    states = [{name: t + version for name, t in base.items()} for version in (1, 2, 3)]
    sender = WeightSender("127.0.0.1", 2, "gloo", TIMEOUT, torch.float32)
    me = explorer(engines, sync)
    thread = threading.Thread(target=trainer, args=(sync, sender, states))
    thread.start()
    try:
        # waiting for version 2, the explorer takes 1 first: the trainer sends 2 only then
        assert me._sync(Wanted(2)) == 2
        held = engines[1].hosted.engine.model.state_dict()
        assert all(torch.equal(held[name], t) for name, t in states[1].items())
        # waiting for the trainer's end, it takes version 3, which the trainer sends last
        assert me._sync(Wanted(None, final=True)) == 3
        for engine in engines:
            held = engine.hosted.engine.model.state_dict()
            assert all(torch.equal(held[name], t) for name, t in states[2].items())
            assert engine.model_version() == 3
    finally:
        thread.join()
        for host in [*engines, sync]:
            host.close()


class Restarted:
    """An engine that came back from a restart with its initial weights (version 0)."""

    async def model_version(self):
        return 0


def test_an_engine_restarted_under_nccl_fails_naming_it(tmp_path):
    sync = LoopHost(lambda: Synchronizer("nccl", str(tmp_path), TIMEOUT, True), "sync")
    held = LoopHost(lambda: SimpleNamespace(model_version=_at(2)), "held")
    lost = LoopHost(Restarted, "lost")
    me = explorer([held, lost], sync)
    me.loaded_version = 2
    sync.publish(2, ["an offer already sent"])
    with pytest.raises(RuntimeError) as caught:
        me._sync(Wanted(2))
    assert str(caught.value).startswith(
        "rollout engine 1 restarted and lost model version 2; synchronizer.sync_method nccl "
        "sends each version once"
    )
    for host in (sync, held, lost):
        host.close()


def _at(version):
    async def model_version():
        return version

    return model_version
