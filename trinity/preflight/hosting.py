"""Where a stage runs: in the launcher's process (``runtime/local_stage.py``) or on Ray.

A function of the config alone, so it sits with the checks: they refuse what needs one
process but would need Ray (``mode: colocate``, GPU roles), and the launcher reads the same
answer to choose how it runs each stage.
"""

from __future__ import annotations

import os
from typing import Any, List

from trinity.common.config.gpus import gpu_shares
from trinity.engine import DEFAULT_ENGINE, ENGINES
from trinity.preflight.decoupled import reads_explorer_store


def ray_reasons(config: Any) -> List[str]:
    """Why this stage runs on Ray (none: ``runtime/local_stage.py`` runs it)."""
    rollout, explorer = config.explorer.rollout_model, config.explorer
    gpus = gpu_shares(config).total
    reasons = {
        "cluster.in_process is false": not config.cluster.in_process,
        "RAY_ADDRESS names a cluster": bool(os.environ.get("RAY_ADDRESS")),
        "cluster.node_num > 1": config.cluster.node_num > 1,
        # one GPU is shared in this process; more are each role's own, in a Ray actor
        f"{gpus} GPUs (cluster.node_num x gpu_per_node), each role on its own": gpus > 1
        and config.mode != "colocate",
        "trainer.cpu_ranks > 1": config.trainer.cpu_ranks > 1,
        "monitor.enable_ray_timeline": config.monitor.enable_ray_timeline,
        "log.group_by_node": config.log.group_by_node,
        # a decoupled trainer follows the explorer's store from another process
        "the trainer reads a separate explore run's store": reads_explorer_store(config),
    }
    if config.mode != "train":
        reasons["explorer.env_vars (set per runner process)"] = bool(explorer.env_vars)
        # NCCL allows one rank per GPU and process; on CPU the gloo ranks (trainer, engines)
        # are threads of this process (``weight_transfer.make_group`` builds groups directly)
        reasons["synchronizer.sync_method nccl on GPUs"] = (
            config.synchronizer.sync_method == "nccl" and gpus > 0
        )
        # A registered engine runs in a LocalEngine here; an unregistered name is refused.
        # Unset (a config not derived yet, hardware.py): the default engine.
        for served in (rollout, *explorer.auxiliary_models):
            name = served.engine_type or DEFAULT_ENGINE
            reasons[f"engine_type {name}"] = name not in ENGINES
    return [why for why, applies in reasons.items() if applies]


def runs_in_process(config: Any) -> bool:
    """Whether the stage runs in the launcher's process (``runtime/local_stage.py``): every
    mode does, unless something needs Ray."""
    return not ray_reasons(config)
