"""How a stage's GPUs divide between its roles, and what of it this build can run.

As in veRL (docs/guides/gpu.md, "GPUs on one node"): the cluster has
``cluster.node_num`` x ``cluster.gpu_per_node`` GPUs; each model the explorer serves takes
``engine_num`` x ``tensor_parallel_size`` of them (the rollout model, then each auxiliary
model; an external model's engines are an API's and take none), and the trainer the rest.

What runs:

- **One GPU** (``node_num`` 1 x ``gpu_per_node`` 1): every role of the stage shares it in
  ``trinity run``'s own process (``runtime/local_stage.py``), as ``mode: colocate`` asks; the
  arithmetic does not apply. On Ray (a stage that needs it) one GPU is only enough when one
  role computes: the trainer of a ``train`` stage, or the one engine of an ``explore`` stage.
- **Several GPUs** on one node: each role gets GPUs of its own (a Ray placement group,
  ``runtime/gpu_bundles.py``), so the stage runs on Ray. The trainer must get at least one
  GPU in ``both`` and ``train`` stages, and at most one: a trainer on several GPUs needs
  FSDP2 ranks over NCCL, not built yet (``trainer.cpu_ranks`` are CPU ranks). ``explore``
  and ``bench`` stages need no more GPUs than their engines take; the others stay idle.
- ``mode: colocate`` is one process on one GPU: more GPUs are refused.
- ``tensor_parallel_size`` > 1 with GPUs is refused: an engine runs on one GPU (vLLM's tensor
  parallelism is not wired into the placement yet). That, and more GPUs than the machine
  has, are said by ``preflight/hardware.py`` with the overrides that fit the stage here.
- Several nodes with GPUs are refused in ``nodes.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from trinity.common.config.config import Config

EXPLORING_MODES = ("both", "colocate", "explore", "bench")
TRAINING_MODES = ("both", "colocate", "train", "serve")


def detect_gpu_count() -> int:
    """GPUs visible to this process."""
    import torch

    return torch.cuda.device_count()


@dataclass(frozen=True)
class EngineShare:
    """The GPUs of one served model's engines: ``engine_num`` x ``tensor_parallel_size``."""

    key: str  # its YAML path: explorer.rollout_model, explorer.auxiliary_models[0]
    engine_num: int
    tensor_parallel_size: int
    auxiliary: Optional[int] = None  # its index in explorer.auxiliary_models

    @property
    def gpus(self) -> int:
        return self.engine_num * self.tensor_parallel_size

    def term(self) -> str:
        """How its GPUs are counted, as the problems say it."""
        return (
            f"{self.key}.engine_num ({self.engine_num}) x tensor_parallel_size "
            f"({self.tensor_parallel_size})"
        )


@dataclass(frozen=True)
class GpuShares:
    """A stage's GPUs and how they divide between its engines and its trainer."""

    node_num: int
    gpu_per_node: int
    engines: Tuple[EngineShare, ...]  # the served models whose engines the stage starts
    trains: bool  # the stage has a trainer

    @property
    def total(self) -> int:
        return self.node_num * self.gpu_per_node

    @property
    def engine_gpus(self) -> int:
        return sum(share.gpus for share in self.engines)

    @property
    def trainer_gpus(self) -> int:
        """The rest, when the stage trains (negative: the engines take too many)."""
        return self.total - self.engine_gpus if self.trains else 0

    def cluster_term(self) -> str:
        return (
            f"cluster.node_num ({self.node_num}) x cluster.gpu_per_node ({self.gpu_per_node}) "
            f"= {self.total}"
        )

    def engine_term(self) -> str:
        """``<term> + <term> = N GPUs`` of the engines."""
        terms = " + ".join(share.term() for share in self.engines)
        return f"{terms} = {self.engine_gpus} GPU{'' if self.engine_gpus == 1 else 's'}"

    def trainer_term(self) -> str:
        """Where the trainer's GPUs come from, as the problems say it."""
        if not self.engines:  # a train stage, or engines that are all external APIs
            return f"the trainer takes all {self.cluster_term()} GPUs"
        return (
            f"{self.engine_term()} for the engines leave {max(self.trainer_gpus, 0)} of "
            f"{self.cluster_term()} for the trainer"
        )

    def problems(self) -> List[str]:
        """What of this division cannot run when each role gets GPUs of its own."""
        if not self.trains:
            if self.engine_gpus <= self.total:
                return []
            return [
                f"{self.engine_term()} for the engines, more than the {self.cluster_term()} "
                f"of the cluster; lower engine_num (the engines may take {self.total} at most)"
            ]
        left = self.trainer_gpus
        if left < 1:
            return [
                f"{self.trainer_term()}, which needs at least 1; lower engine_num (the "
                f"engines may take {self.total - 1} at most)"
            ]
        if left > 1:
            more = f" or raise engine_num by {left - 1}" if self.engines else ""
            return [
                f"{self.trainer_term()}: a trainer on more than one GPU (FSDP2 ranks over "
                "NCCL) is not supported yet; set cluster.gpu_per_node: "
                f"{self.engine_gpus + 1}{more}"
            ]
        return []


def gpu_shares(config: Config) -> GpuShares:
    """How a finalized stage's GPUs divide (``gpu_per_node`` unset counts as 0)."""
    explorer, engines = config.explorer, []
    if config.mode in (*EXPLORING_MODES, "serve"):
        served = [("explorer.rollout_model", None, explorer.rollout_model)]
        served += [
            (f"explorer.auxiliary_models[{i}]", i, a)
            for i, a in enumerate(explorer.auxiliary_models)
        ]
        engines = [
            EngineShare(key, model.engine_num, model.tensor_parallel_size, index)
            for key, index, model in served
            if model.engine_type != "external"  # an API's engines run elsewhere
        ]
    return GpuShares(
        config.cluster.node_num,
        config.cluster.gpu_per_node or 0,
        tuple(engines),
        config.mode in TRAINING_MODES,
    )


def gpu_problems(config: Config) -> List[str]:
    """What a finalized config's GPU settings cannot run, one line each. GPUs this machine
    lacks and engines on several GPUs are ``preflight/hardware.py``'s, with the overrides
    that fit the stage here; the arithmetic below assumes neither."""
    shares = gpu_shares(config)
    gpus = shares.gpu_per_node
    if gpus == 0 or gpus > detect_gpu_count():
        return []
    if any(share.tensor_parallel_size > 1 for share in shares.engines):
        return []
    if config.mode == "colocate" and shares.total > 1:
        return [
            f"mode colocate runs the trainer and the engines in one process on one GPU, but "
            f"{shares.cluster_term()} GPUs; set cluster.gpu_per_node: 1"
        ]
    if shares.node_num == 1 and shares.total > 1:
        return shares.problems()
    return []
