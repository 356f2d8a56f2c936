"""``cluster.node_num: 2`` on a two-node Ray cluster on this machine: a head raylet on
127.0.0.1 and a worker raylet on 127.0.0.2 (both loopback), each with its own 2 CPUs. The
trainer's ranks run on the driver's node, the engines and runners on the other, and with
``log.group_by_node`` each actor logs under ``log/<its node's ip>/``.

The cluster and the runs live in a process of their own (this file run as a module): the
run joins the cluster through ``RAY_ADDRESS``, as a user's would, and the session's Ray
(the ``ray_cluster`` fixture) is neither used nor disturbed, whatever the test order.
"""

import json
import os
import re
import sys
from typing import List

import pytest

from tests.integration.conftest import base_overrides, module_report
from tests.integration.test_run import CONFIG, records

HEAD_IP, WORKER_IP = "127.0.0.1", "127.0.0.2"


def two_node_runs(out_path: str, overrides: List[str]) -> None:
    """Start the cluster, run the stage on it, then ask for three nodes; write the cluster's
    nodes, the job dir and the three-node error to ``out_path`` (JSON); stop the cluster."""
    # Before ray is imported: addresses on loopback stay loopback (as in a local run).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._common.utils import reset_ray_address
    from ray.cluster_utils import Cluster

    from trinity.common.config import ConfigError
    from trinity.runtime.launcher import run

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": HEAD_IP, "include_dashboard": False},
    )
    # Cluster records its address where a bare ray.init() looks: no other Ray driver on
    # this machine (another test session) may join this test cluster.
    reset_ray_address()
    report = {}
    try:
        cluster.add_node(num_cpus=2, node_ip_address=WORKER_IP)
        os.environ["RAY_ADDRESS"] = cluster.address
        (result,) = run(CONFIG, overrides, [])
        report["job_dir"] = result.job_dir
        report["nodes"] = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        three = [o for o in overrides if not o.startswith("checkpoint_root_dir")]
        three += ["cluster.node_num=3", "explorer.rollout_model.engine_num=2"]
        three += [f"checkpoint_root_dir={os.path.join(os.path.dirname(out_path), 'three')}"]
        try:
            run(CONFIG, three, [])
        except ConfigError as exc:
            report["three_nodes"] = str(exc)
    finally:
        ray.shutdown()
        cluster.shutdown()
    with open(out_path, "w") as f:
        json.dump(report, f)


def _node_of(log_path: str) -> str:
    """The node id an actor's log says it ran on (``setup_process``'s line)."""
    with open(log_path) as f:
        found = re.search(r"runs on node ([0-9a-f]+) \(([\d.]+)\)", f.read())
    assert found, f"no node line in {log_path}"
    return found.group(1)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.mark.slow
def test_engines_and_trainer_ranks_run_on_separate_nodes(tmp_path, micro_model, arithmetic_data):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "cluster.node_num=2",
        "trainer.cpu_ranks=2",
        "log.group_by_node=true",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
    ]
    report = module_report(__name__, os.path.join(tmp_path, "report.json"), overrides)
    nodes, job = report["nodes"], report["job_dir"]
    assert set(nodes) == {HEAD_IP, WORKER_IP}
    assert [r["step"] for r in records(job, "trainer")] == [1, 2]
    assert [r["step"] for r in records(job, "explorer")] == [1, 2]

    log = os.path.join(job, "log")
    assert sorted(os.listdir(log)) == [HEAD_IP, WORKER_IP]  # no actor logs at the top
    trainer_side = sorted(os.listdir(os.path.join(log, HEAD_IP)))
    engine_side = sorted(os.listdir(os.path.join(log, WORKER_IP)))
    assert trainer_side == ["trainer.log", "trainer_rank_1.log"]
    assert engine_side == [
        "explorer.log",
        "explorer_engine_0.log",
        "explorer_runner_0.log",
        "explorer_runner_1.log",
    ]
    # each actor's own record of its node: the ranks on the driver's node, engines on the other
    for name in trainer_side:
        assert _node_of(os.path.join(log, HEAD_IP, name)) == nodes[HEAD_IP]
    for name in engine_side:
        assert _node_of(os.path.join(log, WORKER_IP, name)) == nodes[WORKER_IP]
    # threads come from each node's own 2 CPUs: the engine has them alone, the ranks split them
    assert "with 2 torch thread(s)" in _read(os.path.join(log, WORKER_IP, "explorer_engine_0.log"))
    assert "with 1 torch thread(s)" in _read(os.path.join(log, HEAD_IP, "trainer_rank_1.log"))

    # Asking for more nodes than the cluster has fails before any role starts.
    assert (
        "cluster.node_num = 3 but the Ray cluster this run joined has 2 alive node(s)"
        in (report["three_nodes"])
    )
    assert not os.path.exists(os.path.join(tmp_path, "three", "tests", "grpo_small", "log"))


if __name__ == "__main__":
    two_node_runs(sys.argv[1], sys.argv[2:])
