"""Checks of ``cluster.gpu_per_node`` that need only the config and this machine's GPU count.

GPUs are used by a stage that runs in ``trinity run``'s own process (``runtime/
local_stage.py``): the trainer and the rollout engines share the first visible GPU, as
``mode: colocate`` asks. Placing roles on separate GPUs (Ray placement groups) is not built
yet, so a stage that would need more than one GPU, or Ray, with GPUs is refused here.
"""

from __future__ import annotations

from typing import List

from trinity.common.config.config import Config


def detect_gpu_count() -> int:
    """GPUs visible to this process."""
    import torch

    return torch.cuda.device_count()


def gpu_problems(config: Config) -> List[str]:
    """What a finalized config's GPU settings cannot run on this machine, one line each."""
    gpus = config.cluster.gpu_per_node or 0
    if gpus == 0:
        return []
    seen = detect_gpu_count()
    if gpus > seen:
        return [
            f"cluster.gpu_per_node = {gpus} but this machine has {seen} GPU(s) visible to "
            f"torch{'' if seen else ' (a CPU-only torch build, or CUDA_VISIBLE_DEVICES empty)'}"
            f"; set cluster.gpu_per_node: {seen} or leave it unset (detected)"
        ]
    if gpus > 1:
        return [
            f"cluster.gpu_per_node = {gpus}: placing the trainer and the engines on separate "
            "GPUs is not supported yet; set cluster.gpu_per_node: 1 (they share one GPU, "
            "mode: colocate)"
        ]
    return []
