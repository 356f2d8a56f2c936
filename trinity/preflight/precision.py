"""Half precision on a CPU that has no instructions for it.

On CPUs with bf16 instructions (AVX512-BF16, AMX) a bf16 engine or trainer is 2-3x faster
than fp32; on the others (AVX2-only x86, many cloud VMs) PyTorch emulates bf16 and fp16 and
a matmul runs two orders of magnitude slower than in fp32 (0.28 against 104 GFLOP/s on a
2-core AMD EPYC, torch 2.13.0). The run is still right, so this is a warning, not a refusal:
it names each key that asks for it and the override back to fp32, before anything starts.
"""

from __future__ import annotations

import logging
from typing import List, Tuple

from trinity.algorithm.algorithm import needs_reference
from trinity.common.config.config import Config
from trinity.preflight.support import algorithm_class
from trinity.utils.device import cpu_supports

logger = logging.getLogger("trinity.config")

HALF = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
_VERL = "trainer.trainer_config"
_LOCAL_ENGINES = ("transformers", "vllm")  # the others compute elsewhere (a service, an API)


def half_precision_keys(config: Config) -> List[Tuple[str, str, str]]:
    """(key, value, override) for each engine or trainer dtype of the stage that computes
    in bf16 or fp16 on the CPU (``cluster.gpu_per_node`` 0)."""
    if config.cluster.gpu_per_node:
        return []
    found = []
    explorer = config.explorer
    if config.mode not in ("train",):
        served = [("explorer.rollout_model", explorer.rollout_model)]
        served += [
            (f"explorer.auxiliary_models.{i}", m) for i, m in enumerate(explorer.auxiliary_models)
        ]
        for path, model in served:
            if model.engine_type in _LOCAL_ENGINES and model.dtype in HALF:
                found.append((f"{path}.dtype", model.dtype, "float32"))
    if config.mode not in ("explore", "bench") and not config.model.tinker.enable:
        for path, section in _trainer_sections(config):
            value = section.fsdp_config.mixed_precision.param_dtype
            if value in HALF:
                found.append(
                    (f"{_VERL}.{path}.fsdp_config.mixed_precision.param_dtype", value, "fp32")
                )
    return found


def _trainer_sections(config: Config) -> List[Tuple[str, object]]:
    """The veRL sections whose model this stage's trainer computes with."""
    verl, algorithm = config.trainer.trainer_config, config.algorithm
    cls = algorithm_class(config)
    sections: List[Tuple[str, object]] = [("actor_rollout_ref.actor", verl.actor_rollout_ref.actor)]
    kl = (algorithm.kl_loss_fn or "none", algorithm.kl_penalty_fn or "none")
    try:
        if needs_reference(cls, *kl, algorithm.policy_loss_fn):
            sections.append(("actor_rollout_ref.ref", verl.actor_rollout_ref.ref))
    except (KeyError, ValueError):  # reported by the component checks
        pass
    if getattr(cls, "use_critic", False):
        sections.append(("critic.model", verl.critic.model))
    return sections


def warn_half_precision(config: Config) -> None:
    """Warn when the stage computes in a half precision this CPU has no instructions for."""
    found = [f for f in half_precision_keys(config) if not cpu_supports(HALF[f[1]])]
    if not found:
        return
    lines = "\n".join(f"  - {key} = {value}" for key, value, _ in found)
    fix = " ".join(f"{key}={override}" for key, _, override in found)
    logger.warning(
        "This CPU has no bf16/fp16 instructions (torch's oneDNN reports none), so these run "
        "emulated, about 100x slower than fp32:\n%s\nto compute in fp32 instead, add: %s",
        lines,
        fix,
    )
