"""GPU placement over logical GPUs: a one-node Ray that declares 4 GPUs (none exists; Ray
only counts them and sets each actor's ``CUDA_VISIBLE_DEVICES`` from its assignment).

Probe actors are placed by the calls the launcher and the explorer make for the trainer and
each engine (``Placement.options`` / ``engine_options`` over ``reserve_gpus``), and report
what they see. A real ``both`` stage on 2 of the GPUs then runs as far as torch lets it
without CUDA: the trainer actor is started in its bundle, logs the GPU it was given, and
fails where it would put the model on ``cuda:0``. Several nodes with GPUs are refused before
any Ray starts.

The Ray with GPUs lives in a process of its own (this file run as a module), so the
session's Ray (the ``ray_cluster`` fixture, without GPUs) is neither used nor disturbed.
"""

import json
import os
import re
import sys
from typing import Any, Dict, List

import pytest

from tests.integration.conftest import base_overrides, module_report
from tests.integration.test_run import CONFIG

GPUS = 4


def _probe(name: str, options: Dict[str, Any]) -> Any:
    """An actor named ``name`` started with ``options``, that says which GPUs it sees."""
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def sees(self) -> Dict[str, Any]:
            return {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "ids": ray.get_gpu_ids()}

    return Probe.options(name=name, **options).remote()


def _placed(config: Any, wait_s: float = 30.0) -> Dict[str, Any]:
    """What the trainer, each engine and the explorer see when placed as a stage places
    them (with GPUs reserved for ``config``); the GPUs are released after."""
    import ray

    from trinity.runtime.gpu_bundles import engine_prefix, release_gpus, reserve_gpus
    from trinity.runtime.placement import Placement

    placement = Placement(gpus=reserve_gpus(config, wait_s))
    # the explorer actor computes nothing: it has no bundle, so Ray assigns it no GPU
    probes = {"explorer": _probe("explorer", placement.options(config.explorer.name, None))}
    if config.mode == "both":
        name = config.trainer.name
        probes[name] = _probe(name, placement.options(name, None))
    served = [(None, config.explorer.rollout_model)]
    served += list(enumerate(config.explorer.auxiliary_models))
    for index, model in served:
        prefix = engine_prefix(config, index)
        for i in range(model.engine_num):
            name = f"{prefix}_engine_{i}"
            probes[name] = _probe(name, placement.engine_options(prefix, i))
    seen = {name: ray.get(actor.sees.remote()) for name, actor in probes.items()}
    for actor in probes.values():
        ray.kill(actor)
    release_gpus(placement.gpus)
    return seen


def _value(overrides: List[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}="))


def _config(overrides: List[str]) -> Any:
    from trinity.common.config import load_config
    from trinity.preflight.derive import finalize

    return finalize(load_config(CONFIG, overrides))


def logical_gpu_runs(out_path: str, overrides: List[str]) -> None:
    """Start a Ray with ``GPUS`` logical GPUs, place stages on it, run one; write what was
    seen to ``out_path`` (JSON)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback, as a local run
    import ray

    import trinity.common.config.gpus as gpus_module
    from trinity.common.config import ConfigError
    from trinity.runtime.failures import RunFailed
    from trinity.runtime.gpu_bundles import check_gpu_count, release_gpus, reserve_gpus

    gpus_module.detect_gpu_count = lambda: 8  # the driver's torch "sees" them too
    ray.init(num_cpus=2, num_gpus=GPUS, include_dashboard=False, namespace="gpu-placement")
    report: Dict[str, Any] = {}
    both = ["cluster.gpu_per_node=4", "explorer.rollout_model.engine_num=2"]
    both += [f"explorer.auxiliary_models=[{{model_path: {_value(overrides, 'model.model_path')}}}]"]
    report["both"] = _placed(_config(overrides + both))
    # released: the next stage gets every GPU again
    explore = ["mode=explore", "cluster.gpu_per_node=4", "explorer.rollout_model.engine_num=4"]
    report["explore"] = _placed(_config(overrides + explore))
    big = _config(overrides + ["cluster.gpu_per_node=8", "explorer.rollout_model.engine_num=7"])
    try:
        check_gpu_count([big])
    except ConfigError as exc:
        report["too_many"] = str(exc)
    held = reserve_gpus(_config(overrides + both))
    try:  # every GPU is held: the next reservation waits, then says so
        reserve_gpus(_config(overrides + explore), wait_s=1.0)
    except RunFailed as exc:
        report["busy"] = str(exc)
    release_gpus(held)
    report["run"] = _real_stage(overrides)
    report["groups"] = [g["state"] for g in ray.util.placement_group_table().values()]
    ray.shutdown()
    with open(out_path, "w") as f:
        json.dump(report, f)


def _real_stage(overrides: List[str]) -> Dict[str, Any]:
    """A ``both`` stage with its trainer and its engine on a GPU each: how it fails without
    CUDA, and the GPUs the trainer's log says it was given."""
    from trinity.runtime.failures import RunFailed
    from trinity.runtime.launcher import run

    stage = [
        "cluster.gpu_per_node=2",
        "buffer.total_steps=1",
        "buffer.explorer_input.eval_tasksets=[]",
    ]
    try:
        run(CONFIG, overrides + stage, [])
    except RunFailed as exc:
        root = _value(overrides, "checkpoint_root_dir")
        log = os.path.join(root, "tests", "grpo_small", "log", "trainer.log")
        with open(log) as f:
            found = re.search(r"runs on node .* torch thread\(s\), GPUs (\S+)", f.read())
        return {"error": str(exc), "trainer_gpus": found.group(1) if found else None}
    return {"error": None}


@pytest.fixture(scope="module")
def report(tmp_path_factory, micro_model, arithmetic_data) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gpus")
    overrides = base_overrides(tmp, micro_model, arithmetic_data)
    return module_report(__name__, os.path.join(tmp, "report.json"), overrides)


@pytest.mark.slow
def test_each_engine_and_the_trainer_see_a_gpu_of_their_own(report):
    seen = report["both"]
    gpu_roles = [
        "trainer",
        "explorer_engine_0",
        "explorer_engine_1",
        "explorer_auxiliary_0_engine_0",
    ]
    assert sorted(seen) == sorted(gpu_roles + ["explorer"])
    visible = [seen[name]["cuda"] for name in gpu_roles]
    assert sorted(visible) == ["0", "1", "2", "3"]  # one each, every GPU used
    assert all(seen[name]["ids"] == [int(seen[name]["cuda"])] for name in gpu_roles)
    assert seen["explorer"]["ids"] == []  # no GPU asked, none assigned


def test_released_gpus_go_to_the_next_stage(report):
    seen = report["explore"]
    engines = [f"explorer_engine_{i}" for i in range(4)]
    assert sorted(seen[name]["cuda"] for name in engines) == ["0", "1", "2", "3"]


def test_a_cluster_without_the_gpus_is_a_config_error_and_a_busy_one_a_failure(report):
    assert (
        "cluster.gpu_per_node = 8: the stage's roles take 8 GPUs on one node, but the Ray "
        "cluster this run joined has at most 4 GPU(s) on a node" in report["too_many"]
    )
    assert report["busy"].startswith("the stage's 4 GPUs on one node were not free within 1 s")


def test_a_real_stage_puts_its_trainer_on_its_gpu(report):
    run = report["run"]
    # without CUDA the trainer fails where it would move the model onto its GPU
    assert "this role was given GPUs" in run["error"], run
    assert run["trainer_gpus"] in ("0", "1")  # one of the stage's 2, as Ray assigned it
    assert set(report["groups"]) == {"REMOVED"}  # every stage's GPUs were released


def test_several_nodes_with_gpus_are_refused_before_ray(
    tmp_path, micro_model, arithmetic_data, monkeypatch
):
    import trinity.common.config.gpus as gpus_module
    from trinity.common.config import ConfigError
    from trinity.runtime.launcher import run

    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 4)
    # a cluster to join (never reached): without one, several nodes are this machine's lack
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data)
    overrides += ["cluster.node_num=2", "cluster.gpu_per_node=4"]
    with pytest.raises(ConfigError) as excinfo:
        run(CONFIG, overrides, [])
    assert excinfo.value.problems == [
        "cluster.node_num = 2 with cluster.gpu_per_node = 4: placing GPU work across nodes is "
        "not supported yet; set cluster.node_num: 1, or cluster.gpu_per_node: 0 to run on the "
        "nodes' CPUs"
    ]
    assert not os.path.exists(tmp_path / "tests")  # nothing started, nothing written


if __name__ == "__main__":
    logical_gpu_runs(sys.argv[1], sys.argv[2:])
