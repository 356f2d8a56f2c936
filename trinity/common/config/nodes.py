"""Checks of ``cluster.node_num`` that need only the config (the cluster is counted later,
in ``runtime/placement.py``, once the run has joined it).

With ``node_num`` >= 2 the trainer takes one node and the rollout engines the others, on
CPUs only: spreading GPU work over nodes is not built yet.
"""

from __future__ import annotations

from typing import List

from trinity.common.config.config import Config


def node_problems(config: Config) -> List[str]:
    """What a finalized config with ``cluster.node_num`` >= 2 cannot run, one line each."""
    nodes = config.cluster.node_num
    if nodes < 2:
        return []
    problems = []
    gpus = config.cluster.gpu_per_node or 0
    if gpus > 0:
        problems.append(
            f"cluster.node_num = {nodes} with cluster.gpu_per_node = {gpus}: placing GPU work "
            "across nodes is not supported yet; set cluster.node_num: 1, or "
            "cluster.gpu_per_node: 0 to run on the nodes' CPUs"
        )
    if config.mode == "train":
        problems.append(
            f"cluster.node_num = {nodes} with mode train: the trainer runs on one node (its "
            "ranks share a loopback process group), so the other nodes would stay idle; set "
            "cluster.node_num: 1"
        )
        return problems
    engines = config.explorer.rollout_model.engine_num
    engine_nodes = nodes - 1 if config.mode in ("both", "colocate") else nodes
    if engines < engine_nodes:
        problems.append(
            f"explorer.rollout_model.engine_num = {engines} with cluster.node_num = {nodes} "
            f"in mode {config.mode}: the engines are spread over {engine_nodes} node(s)"
            f"{' (the trainer takes one)' if config.mode == 'both' else ''}, so some would "
            f"have none; set engine_num >= {engine_nodes} or a smaller node_num"
        )
    return problems
