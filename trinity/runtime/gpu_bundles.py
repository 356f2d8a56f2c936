"""The GPUs of a stage on Ray: one placement group, a bundle per role that computes on GPUs.

``common/config/gpus.py`` divides the stage's GPUs; here they are reserved. Bundle order:
the trainer's (the GPUs the engines leave), then one per engine (``tensor_parallel_size``
GPUs), the rollout model's engines first, then each auxiliary model's. The group packs
every bundle onto one node (``STRICT_PACK``: several nodes with GPUs are refused before
start). An actor placed in a bundle asks for its GPUs (``num_gpus``), so Ray sets its
``CUDA_VISIBLE_DEVICES`` to them alone and the role computes on ``cuda:0``
(``utils/device.py``). Bundles hold GPUs only: the roles reserve no CPUs, their torch
threads split the cores instead (``roles.compute_threads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from trinity.common.config.gpus import gpu_shares

# How long the run waits for the cluster's free GPUs (another job may hold them).
RESERVE_WAIT_S = 60.0


def engine_prefix(config: Any, auxiliary: Optional[int]) -> str:
    """The name prefix of a served model's engines (``<prefix>_engine_<i>``), as
    ``ExplorerRole.start_engines`` names them."""
    name = config.explorer.name
    return name if auxiliary is None else f"{name}_auxiliary_{auxiliary}"


def gpu_slots(config: Any) -> List[Tuple[str, int]]:
    """(actor name, GPUs) of each role of the stage that computes on GPUs of its own, in
    bundle order; none on CPU, or when the roles share one GPU (in one process)."""
    shares = gpu_shares(config)
    if shares.total == 0 or shares.problems():
        return []
    slots = [(config.trainer.name, shares.trainer_gpus)] if shares.trains else []
    for share in shares.engines:
        prefix = engine_prefix(config, share.auxiliary)
        slots += [
            (f"{prefix}_engine_{i}", share.tensor_parallel_size) for i in range(share.engine_num)
        ]
    return slots


@dataclass(frozen=True)
class GpuBundles:
    """A stage's reserved GPUs: the placement group and who owns each bundle."""

    group: Any  # ray.util.placement_group.PlacementGroup
    slots: Tuple[Tuple[str, int], ...]  # (actor name, GPUs), in bundle order

    def options(self, name: str) -> Optional[Dict[str, Any]]:
        """Ray actor options that put actor ``name`` on its GPUs; None when it has none."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for index, (owner, gpus) in enumerate(self.slots):
            if owner == name:
                strategy = PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=index
                )
                return {"num_gpus": gpus, "scheduling_strategy": strategy}
        return None


def reserve_gpus(config: Any, wait_s: float = RESERVE_WAIT_S) -> Optional[GpuBundles]:
    """Reserve the stage's GPUs (None when it computes on CPUs); ``release_gpus`` frees them."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from trinity.runtime.failures import RunFailed

    slots = gpu_slots(config)
    if not slots:
        return None
    group = placement_group([{"GPU": gpus} for _, gpus in slots], strategy="STRICT_PACK")
    try:
        ray.get(group.ready(), timeout=wait_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        needed = sum(gpus for _, gpus in slots)
        raise RunFailed(
            f"the stage's {needed} GPUs on one node were not free within {wait_s:.0f} s: "
            "another job on the Ray cluster holds them (`ray status` shows who); stop it "
            "or lower cluster.gpu_per_node"
        ) from None
    return GpuBundles(group, tuple(slots))


def release_gpus(bundles: Optional[GpuBundles]) -> None:
    if bundles is not None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(bundles.group)


def check_gpu_count(stages: List[Any]) -> None:
    """After joining Ray: a node of the cluster has the GPUs each stage packs onto one."""
    import ray

    from trinity.common.config import ConfigError
    from trinity.preflight.hosting import runs_in_process

    most = max((int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["Alive"]), default=0)
    problems = []
    for stage in stages:
        needed = 0 if runs_in_process(stage) else sum(gpus for _, gpus in gpu_slots(stage))
        if needed > most:
            problems.append(
                f"cluster.gpu_per_node = {stage.cluster.gpu_per_node}"
                f"{f' (stage {stage.name})' if len(stages) > 1 else ''}: the stage's roles take "
                f"{needed} GPUs on one node, but the Ray cluster this run joined has at most "
                f"{most} GPU(s) on a node; lower cluster.gpu_per_node, or join a cluster "
                "whose nodes have the GPUs (`ray start --num-gpus=N`)"
            )
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
