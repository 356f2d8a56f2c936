"""Which Ray node each role's actors run on (``cluster.node_num``).

With ``node_num: 1`` nothing is pinned: Ray places every actor, as it always has. With
N >= 2 a stage takes N alive nodes of the cluster the run joined: the driver's node first,
then the others by IP and node id. In a ``both`` stage the trainer and all its ranks run on
the first (the driver's node, so checkpoints are written where the run was started; the
ranks' gloo group listens on loopback, so they share a node) and the rollout engines on the
other N-1: engine ``i`` (of the rollout model and of each auxiliary model) on engine node
``i mod (N-1)``, each workflow runner on its engine's node, the explorer actor on the first
engine node. An ``explore`` stage spreads its engines over all N nodes.

A stage whose roles compute on GPUs of their own has them reserved (``gpu_bundles.py``);
its actors are placed in their GPU bundles instead.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from trinity.runtime.gpu_bundles import GpuBundles


@dataclass(frozen=True)
class Node:
    """One alive node of the Ray cluster: its id, its IP, and Ray's count of its CPUs."""

    node_id: str
    ip: str
    cpus: int


@dataclass(frozen=True)
class Placement:
    """The nodes of a stage's trainer and engines, and its GPU bundles if it has any; an
    empty placement pins nothing."""

    trainer_node: Optional[Node] = None
    engine_nodes: Tuple[Node, ...] = ()
    gpus: Optional[GpuBundles] = None

    @classmethod
    def plan(cls, config: Any, nodes: List[Node]) -> Placement:
        """The placement of a stage over ``nodes`` (``alive_nodes()`` order)."""
        count = config.cluster.node_num
        if count < 2:
            return cls()
        chosen = nodes[:count]
        if config.mode == "explore":
            return cls(None, tuple(chosen))
        # a train stage with several nodes is a config error (common/config/nodes.py)
        return cls(chosen[0], tuple(chosen[1:]) if config.mode in ("both", "colocate") else ())

    @property
    def explorer_node(self) -> Optional[Node]:
        return self.engine_nodes[0] if self.engine_nodes else None

    def engine_node(self, index: int) -> Optional[Node]:
        """The node of engine ``index`` (and of the runners that call it)."""
        return self.engine_nodes[index % len(self.engine_nodes)] if self.engine_nodes else None

    def options(self, name: str, node: Optional[Node]) -> Dict[str, Any]:
        """Ray actor options that place actor ``name``: in its GPU bundle when it has one,
        else on ``node`` (none: anywhere)."""
        placed = self.gpus.options(name) if self.gpus is not None else None
        return placed if placed is not None else pinned(node)

    def engine_options(self, prefix: str, index: int) -> Dict[str, Any]:
        """``options`` of engine ``index`` of the served model whose engines are named
        ``<prefix>_engine_<i>``."""
        return self.options(f"{prefix}_engine_{index}", self.engine_node(index))

    def engines_on(self, node: Node, engine_num: int) -> int:
        """How many of ``engine_num`` engines run on ``node``."""
        return sum(1 for i in range(engine_num) if self.engine_node(i) == node)

    def engine_threads(self, config: Any, index: int) -> int:
        """Torch threads of engine ``index``: a share of its node's CPUs when the engines
        have nodes of their own, else of this machine's cores (``compute_threads``)."""
        from trinity.runtime.roles import compute_threads

        node = self.engine_node(index)
        if node is None:
            return compute_threads(config, "engine")
        here = self.engines_on(node, config.explorer.rollout_model.engine_num)
        return compute_threads(config, "engine", node.cpus, here)


def pinned(node: Optional[Node]) -> Dict[str, Any]:
    """Ray actor options that keep an actor on ``node`` (none when ``node`` is None)."""
    if node is None:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False)}


def alive_nodes() -> List[Node]:
    """The alive nodes of the joined cluster: this process's node first, then by IP and id."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    nodes = [
        Node(n["NodeID"], n["NodeManagerAddress"], int(n["Resources"].get("CPU", 0)))
        for n in ray.nodes()
        if n["Alive"]
    ]
    return sorted(nodes, key=lambda n: (n.node_id != here, n.ip, n.node_id))


def this_node_cpus() -> int:
    """Ray's CPU count of the node this process runs on (its ``--num-cpus``)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    node = next(n for n in alive_nodes() if n.node_id == here)
    return max(1, node.cpus)


def node_address() -> str:
    """This node's address as Ray gives it (127.0.0.1 on the local Ray ``trinity run``
    starts: its loopback switch), or the loopback outside Ray."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


def own_node_cpus(config: Any) -> Optional[int]:
    """In an actor pinned to its role's node (``cluster.node_num`` >= 2), Ray's CPU count
    of that node, which its threads split; None when roles share the machine."""
    return this_node_cpus() if config.cluster.node_num >= 2 else None


def check_node_count(stages: List[Any]) -> List[Node]:
    """After joining Ray: every stage's ``cluster.node_num`` alive nodes exist; the nodes."""
    from trinity.common.config import ConfigError

    if max(stage.cluster.node_num for stage in stages) < 2:
        return []  # one node: Ray places every actor, nothing to count
    nodes = alive_nodes()
    problems = [
        f"cluster.node_num = {stage.cluster.node_num}"
        f"{f' (stage {stage.name})' if len(stages) > 1 else ''} but the Ray cluster this run "
        f"joined has {len(nodes)} alive node(s): add nodes (`ray start --address=<head ip>:6379` "
        "on each) or lower cluster.node_num"
        for stage in stages
        if stage.cluster.node_num > len(nodes)
    ]
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return nodes
