"""How ``trainer.trainer_config`` (veRL keys) maps onto the native trainer.

``carry_verl_settings`` copies the veRL keys a user set into the Trinity keys that own the
same setting (``trainer.grad_clip``, ``algorithm.optimizer``, ...), so each setting has one
authoritative place after ``finalize``. ``effective_trainer_settings`` is what the native
trainer reads.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from pydantic import BaseModel

from trinity.common.config.base import assign, is_set
from trinity.common.config.config import Config
from trinity.common.config.schema_algorithm import OptimizerConfig

_ACTOR = "trainer.trainer_config.actor_rollout_ref.actor"
_ALGORITHM = "trainer.trainer_config.algorithm"

# veRL key (actor's, or under trainer_config.algorithm) -> the algorithm components and their
# argument that hold the same setting; the value goes to each of the algorithm's components
# that takes that argument (a loss without a clip range has nothing to clip).
ACTOR_LOSS_KEYS: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "clip_ratio": (("policy_loss_fn", "clip_range"),),
    "clip_ratio_low": (("policy_loss_fn", "clip_range_low"),),
    "clip_ratio_high": (("policy_loss_fn", "clip_range_high"),),
    "clip_ratio_c": (("policy_loss_fn", "clip_ratio_c"),),
    "entropy_coeff": (("entropy_loss_fn", "entropy_coef"),),
    "kl_loss_coef": (("kl_loss_fn", "kl_coef"),),
    "tau": (("policy_loss_fn", "tau"), ("advantage_fn", "tau")),
    "opmd_baseline": (("advantage_fn", "opmd_baseline"),),
}
VERL_ALGORITHM_KEYS: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "gamma": (("advantage_fn", "gamma"),),
    "lam": (("advantage_fn", "lam"),),
    "norm_adv_by_std_in_grpo": (("advantage_fn", "norm_adv_by_std_in_grpo"),),
    "kl_ctrl": (("kl_penalty_fn", "kl_ctrl"),),
}
# Trinity-RFT 0.1.1 read the actor's kl_loss_coef as DPO's beta.
DPO_LOSS_KEYS = {"kl_loss_coef": (("policy_loss_fn", "beta"),)}
# veRL KL estimator names -> KL_FN names (veRL's "kl" is k1, "mse" is k2)
KL_NAMES = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "k3": "k3"}
KL_NAMES["low_var_kl"] = "low_var_kl"
# Whether an algorithm component takes an argument: (component key, its name, argument).
Takes = Callable[[str, str, str], bool]

# actor key -> trainer key holding the same setting
ACTOR_TO_TRAINER = {
    "grad_clip": "grad_clip",
    "use_dynamic_bsz": "use_dynamic_bsz",
    "ppo_max_token_len_per_gpu": "max_token_len_per_gpu",
    "ulysses_sequence_parallel_size": "ulysses_sequence_parallel_size",
}


def carry_verl_settings(config: Config) -> List[str]:
    """Copy user-set veRL actor keys to their Trinity homes; both set and different is an error."""
    actor = config.trainer.trainer_config.actor_rollout_ref.actor
    problems = []
    for src, dst in ACTOR_TO_TRAINER.items():
        problems += _carry(actor, src, f"{_ACTOR}.{src}", config.trainer, dst, f"trainer.{dst}")
    optimizer = config.algorithm.optimizer
    for key in OptimizerConfig.model_fields:
        problems += _carry(
            actor.optim, key, f"{_ACTOR}.optim.{key}", optimizer, key, f"algorithm.optimizer.{key}"
        )
    return problems


def _carry(
    src: BaseModel, src_key: str, src_path: str, dst: BaseModel, dst_key: str, dst_path: str
) -> List[str]:
    if not is_set(src, src_key):
        return []
    return _carry_value(getattr(src, src_key), src_path, dst, dst_key, dst_path)


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
    optim = critic.optim.model_dump(exclude={"total_training_steps"})
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


def carry_verl_names(config: Config) -> List[str]:
    """The veRL switches that pick an algorithm setting (``use_kl_loss``, ``use_kl_in_reward``,
    ``loss_agg_mode``), written where the algorithm keeps it; run before the algorithm's
    defaults fill what is unset. Set differently in both places: a problem naming both."""
    algorithm, verl = config.algorithm, config.trainer.trainer_config
    actor = verl.actor_rollout_ref.actor
    problems = _carry(
        actor, "loss_agg_mode", f"{_ACTOR}.loss_agg_mode", *_algo(config, "loss_agg_mode")
    )
    if actor.use_kl_loss is not None:
        name = _kl_name(actor.use_kl_loss, actor.kl_loss_type or "low_var_kl")
        source = f"{_ACTOR}.use_kl_loss = {str(actor.use_kl_loss).lower()}"
        problems += _set_name(algorithm, "kl_loss_fn", name, source)
    penalty = _penalty_switch(config)
    if penalty is not None:
        name = _kl_name(penalty, verl.algorithm.kl_penalty or "kl")
        problems += _set_name(algorithm, "kl_penalty_fn", name, f"{_ALGORITHM}.use_kl_in_reward")
    for key, value in (verl.algorithm.rollout_correction or {}).items():
        target = algorithm.rollout_correction
        if key not in type(target).model_fields:
            problems.append(f"{_ALGORITHM}.rollout_correction.{key}: unknown key")
            continue
        problems += _carry_value(
            value,
            f"{_ALGORITHM}.rollout_correction.{key}",
            target,
            key,
            f"algorithm.rollout_correction.{key}",
        )
    return problems


def _algo(config: Config, key: str) -> Tuple[BaseModel, str, str]:
    return config.algorithm, key, f"algorithm.{key}"


def _kl_name(enabled: bool, estimator: str) -> str:
    return KL_NAMES.get(estimator, estimator) if enabled else "none"


def _penalty_switch(config: Config) -> Optional[bool]:
    """Whether veRL's keys turn the KL penalty in the reward on (None: they do not say).
    Without use_kl_in_reward, a kl_penalty or kl_ctrl means the rule of Trinity-RFT 0.1.1
    (and of veRL then): the penalty applies unless the actor has a KL loss."""
    verl = config.trainer.trainer_config
    section = verl.algorithm
    if section.use_kl_in_reward is not None:
        return section.use_kl_in_reward
    if section.kl_penalty is None and section.kl_ctrl is None:
        return None
    return not verl.actor_rollout_ref.actor.use_kl_loss


def _set_name(algorithm: BaseModel, key: str, name: str, source: str) -> List[str]:
    if is_set(algorithm, key) and getattr(algorithm, key) != name:
        return [
            f"{source} means algorithm.{key} = {name}, but algorithm.{key} = "
            f"{getattr(algorithm, key)}; set only algorithm.{key}"
        ]
    setattr(algorithm, key, name)  # stands for what the user wrote: stays user-set
    return []


def _carry_value(
    value: Any, src_path: str, dst: BaseModel, dst_key: str, dst_path: str
) -> List[str]:
    if is_set(dst, dst_key) and getattr(dst, dst_key) != value:
        return [
            f"{src_path} = {value} conflicts with {dst_path} = {getattr(dst, dst_key)}; "
            f"set only {dst_path}"
        ]
    assign(dst, dst_key, value)
    return []


def carry_verl_arguments(config: Config, takes: Takes) -> Tuple[List[str], List[str]]:
    """The veRL loss and advantage keys a user set, written into the ``*_args`` of the
    algorithm's components that take them; run once the component names are known, before
    their default arguments are merged in. Returns (problems: the same argument set
    differently in both places; notes: keys no component of this algorithm takes)."""
    verl = config.trainer.trainer_config
    actor = verl.actor_rollout_ref.actor
    actor_keys = dict(ACTOR_LOSS_KEYS)
    if config.algorithm.algorithm_type == "dpo":
        actor_keys.update(DPO_LOSS_KEYS)
    sources = [(actor, _ACTOR, actor_keys), (verl.algorithm, _ALGORITHM, VERL_ALGORITHM_KEYS)]
    problems: List[str] = []
    notes: List[str] = []
    for section, prefix, table in sources:
        for key, targets in table.items():
            value = getattr(section, key)
            if value is None:
                continue
            found = _carry_argument(config, f"{prefix}.{key}", value, targets, takes)
            if found is None:
                notes.append(
                    f"{prefix}.{key} = {value} is not read: {_taken_by_none(config, targets)}"
                )
            else:
                problems += found
    return problems, notes


def _taken_by_none(config: Config, targets: Tuple[Tuple[str, str], ...]) -> str:
    """Why no component takes the argument: "algorithm grpo's policy_loss_fn ppo takes no
    tau, its advantage_fn grpo takes no tau"."""
    algorithm = config.algorithm
    parts = [
        f"{part} {getattr(algorithm, part) or 'unset'} takes no {arg}" for part, arg in targets
    ]
    return f"algorithm {algorithm.algorithm_type}'s " + ", its ".join(parts)


def _carry_argument(
    config: Config, source: str, value: Any, targets: Tuple[Tuple[str, str], ...], takes: Takes
) -> Optional[List[str]]:
    """Set ``value`` in each target the algorithm's component takes; None when none does."""
    algorithm, problems, carried = config.algorithm, [], False
    for part, arg in targets:
        name = getattr(algorithm, part)
        if name is None or not takes(part, name, arg):
            continue
        carried = True
        args = getattr(algorithm, f"{part}_args")
        if arg in args and args[arg] != value:
            problems.append(
                f"{source} = {value} conflicts with algorithm.{part}_args.{arg} = "
                f"{args[arg]}; set only algorithm.{part}_args.{arg}"
            )
            continue
        setattr(algorithm, f"{part}_args", {**args, arg: value})
    return problems if carried else None
