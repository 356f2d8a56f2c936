"""How ``trainer.trainer_config`` (veRL keys) maps onto the native trainer.

``carry_verl_settings`` copies the veRL keys a user set into the Trinity keys that own the
same setting (``trainer.grad_clip``, ``algorithm.optimizer``, ...), so each setting has one
authoritative place after ``finalize``. ``effective_trainer_settings`` is what the native
trainer reads.
"""

from __future__ import annotations

from typing import Any, Dict, List

from pydantic import BaseModel

from trinity.common.config.base import assign, is_set
from trinity.common.config.config import Config
from trinity.common.config.schema_algorithm import OptimizerConfig

_ACTOR = "trainer.trainer_config.actor_rollout_ref.actor"

# actor key -> trainer key holding the same setting
_ACTOR_TO_TRAINER = {
    "grad_clip": "grad_clip",
    "use_dynamic_bsz": "use_dynamic_bsz",
    "ppo_max_token_len_per_gpu": "max_token_len_per_gpu",
    "ulysses_sequence_parallel_size": "ulysses_sequence_parallel_size",
}


def carry_verl_settings(config: Config) -> List[str]:
    """Copy user-set veRL actor keys to their Trinity homes; both set and different is an error."""
    actor = config.trainer.trainer_config.actor_rollout_ref.actor
    problems = []
    for src, dst in _ACTOR_TO_TRAINER.items():
        problems += _carry(actor, src, f"{_ACTOR}.{src}", config.trainer, dst, f"trainer.{dst}")
    optimizer = config.algorithm.optimizer
    for key in OptimizerConfig.model_fields:
        if key == "warmup_style":  # already folded into lr_scheduler_type
            continue
        problems += _carry(
            actor.optim, key, f"{_ACTOR}.optim.{key}", optimizer, key, f"algorithm.optimizer.{key}"
        )
    return problems


def _carry(
    src: BaseModel, src_key: str, src_path: str, dst: BaseModel, dst_key: str, dst_path: str
) -> List[str]:
    if not is_set(src, src_key):
        return []
    value = getattr(src, src_key)
    if is_set(dst, dst_key) and getattr(dst, dst_key) != value:
        return [
            f"{src_path} = {value} conflicts with {dst_path} = {getattr(dst, dst_key)}; "
            f"set only {dst_path}"
        ]
    assign(dst, dst_key, value)
    return []


def effective_trainer_settings(config: Config) -> Dict[str, Any]:
    """The values the native trainer uses, from a finalized config.

    Keys: micro_batch_size_per_device, grad_clip, ppo_epochs,
    enable_gradient_checkpointing, use_dynamic_bsz, max_token_len_per_device,
    ulysses_sequence_parallel_size, ref_micro_batch_size_per_device, ref_use_dynamic_bsz,
    ref_max_token_len_per_device, param_dtype, ref_param_dtype (compute dtypes of the actor
    and the frozen models), balance_batch, critic_warmup, and ``critic`` (a dict of the
    critic's settings, with ``optimizer`` an ``OptimizerConfig``).
    """
    trainer = config.trainer
    arr = trainer.trainer_config.actor_rollout_ref
    ref = arr.ref
    return {
        "micro_batch_size_per_device": arr.actor.ppo_micro_batch_size_per_gpu,
        "grad_clip": trainer.grad_clip,
        "ppo_epochs": arr.actor.ppo_epochs,
        "enable_gradient_checkpointing": arr.model.enable_gradient_checkpointing,
        "use_dynamic_bsz": trainer.use_dynamic_bsz,
        "max_token_len_per_device": trainer.max_token_len_per_gpu,
        "ulysses_sequence_parallel_size": trainer.ulysses_sequence_parallel_size,
        "ref_micro_batch_size_per_device": ref.log_prob_micro_batch_size_per_gpu,
        "ref_use_dynamic_bsz": _or(ref.log_prob_use_dynamic_bsz, trainer.use_dynamic_bsz),
        "ref_max_token_len_per_device": _or(
            ref.log_prob_max_token_len_per_gpu, trainer.max_token_len_per_gpu
        ),
        "param_dtype": arr.actor.fsdp_config.mixed_precision.param_dtype,
        "ref_param_dtype": ref.fsdp_config.mixed_precision.param_dtype,
        "balance_batch": trainer.trainer_config.trainer.balance_batch,
        "critic_warmup": trainer.trainer_config.trainer.critic_warmup,
        "critic": _critic_settings(config),
    }


def _critic_settings(config: Config) -> Dict[str, Any]:
    trainer = config.trainer
    critic = trainer.trainer_config.critic
    actor = trainer.trainer_config.actor_rollout_ref.actor
    optim = critic.optim.model_dump(exclude={"total_training_steps", "warmup_style"})
    return {
        "model_path": config.model.critic_model_path,
        "optimizer": OptimizerConfig.model_validate(optim),
        "micro_batch_size_per_device": critic.ppo_micro_batch_size_per_gpu,
        "forward_micro_batch_size_per_device": _or(
            critic.forward_micro_batch_size_per_gpu, critic.ppo_micro_batch_size_per_gpu
        ),
        "use_dynamic_bsz": _or(critic.use_dynamic_bsz, trainer.use_dynamic_bsz),
        "max_token_len_per_device": critic.ppo_max_token_len_per_gpu,
        "forward_max_token_len_per_device": _or(
            critic.forward_max_token_len_per_gpu, critic.ppo_max_token_len_per_gpu
        ),
        "ppo_epochs": _or(critic.ppo_epochs, actor.ppo_epochs),
        "grad_clip": critic.grad_clip,
        "cliprange_value": critic.cliprange_value,
        "enable_gradient_checkpointing": critic.model.enable_gradient_checkpointing,
        "param_dtype": critic.model.fsdp_config.mixed_precision.param_dtype,
    }


def _or(value: Any, fallback: Any) -> Any:
    """``value`` unless it is unset (None); falsy values like 0 or False are kept."""
    return fallback if value is None else value
