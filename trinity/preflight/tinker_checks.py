"""``model.tinker.enable`` and ``engine_type: tinker``: what they derive, what cannot go with
them, and the service's answer before start.

A Tinker run trains a LoRA adapter in the service and samples it there; this machine keeps the
tokenizer (``model.model_path``), the loop, the buffer and the algorithm's batch math. So:

- derived: ``model.tinker.base_model`` (``model.model_path`` as written), the rollout
  engine (``tinker``), ``trainer.save_hf_checkpoint`` (``never``: the weights stay in the
  service); ``model.lora_configs`` is dropped with one line, as the guide says it is ignored;
- accepted and unused (``idle_keys``, listed with the other keys that do nothing): the weight
  sync method (weights move through the service) and this machine's trainer layout keys;
- refused before start (``tinker_problems``): what the service cannot compute (a critic, a
  teacher, an entropy term or an advantage fn that reads entropies, logprobs at a
  temperature other than 1, a repetition penalty, a minimum length), trainer ranks here, a
  Hugging Face export, a handover to a next stage;
- asked of this environment and the service before start (``service_problems``): the key
  is set, the service answers (bounded attempts, the URL named) and holds the base model.
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Tuple

from trinity.algorithm import ALGORITHM_TYPE, ENTROPY_LOSS_FN, advantage_fn_class
from trinity.common.config.base import assign, is_set, set_default
from trinity.common.config.config import Config, rollout_temperature
from trinity.engine.tinker_service import (
    KEY_ENV,
    TinkerUnavailable,
    base_model_problem,
    probe,
    sdk_problem,
    service_url,
)
from trinity.trainer.tinker_mapping import entropy_term_is_zero

logger = logging.getLogger("trinity.config")

ENGINE = "tinker"
THROUGH_SERVICE = (
    "with model.tinker.enable the weights move through the Tinker service (the explorer "
    "samples the path each save_weights_for_sampler returns)"
)
SERVICE_TRAINS = "with model.tinker.enable the Tinker service trains the model, not this machine"
# Keys of this machine's trainer layout that a Tinker run does not read.
_TRAINER_KEYS = ("trainer_strategy", "use_dynamic_bsz", "max_token_len_per_gpu")


def derive_tinker(config: Config) -> None:
    """The values ``model.tinker.enable`` decides where the user left them unset."""
    model = config.model
    if not model.tinker.enable:
        return
    set_default(model.tinker, "base_model", model.model_path)
    set_default(config.explorer.rollout_model, "engine_type", ENGINE)
    set_default(config.trainer, "save_hf_checkpoint", "never")
    if model.lora_configs:
        logger.warning(
            "model.lora_configs is ignored: with model.tinker.enable the service trains its own "
            "LoRA adapter (model.tinker.rank, train_mlp, train_attn, train_unembed)"
        )
        assign(model, "lora_configs", None)


def idle_keys(config: Config) -> List[Tuple[str, Any, str]]:
    """(path, value, why) of the keys a user set that a Tinker run does not read."""
    if not config.model.tinker.enable:
        return []
    found = []
    if is_set(config.synchronizer, "sync_method"):
        found.append(("synchronizer.sync_method", config.synchronizer.sync_method, THROUGH_SERVICE))
    for key in _TRAINER_KEYS:
        if is_set(config.trainer, key):
            found.append((f"trainer.{key}", getattr(config.trainer, key), SERVICE_TRAINS))
    return found


def tinker_problems(config: Config) -> List[str]:
    """What cannot run with ``model.tinker.enable`` / ``engine_type: tinker``."""
    engine = config.explorer.rollout_model.engine_type
    if not config.model.tinker.enable:
        if engine == ENGINE and config.mode != "train":
            return [
                "explorer.rollout_model.engine_type = tinker samples the adapter a Tinker "
                "trainer saves: set model.tinker.enable: true (and TINKER_BASE_URL)"
            ]
        return []
    problems = _algorithm_problems(config) + _trainer_problems(config)
    if config.mode != "train":
        problems += _explorer_problems(config)
    return problems


def _algorithm_problems(config: Config) -> List[str]:
    algo = config.algorithm
    algorithm = ALGORITHM_TYPE.get(algo.algorithm_type)
    name = f"algorithm.algorithm_type = {algo.algorithm_type}"
    problems = []
    if algorithm.use_critic:
        problems.append(
            f"{name} trains a critic, which a Tinker run cannot: the service trains one LoRA "
            "policy (model.tinker.enable); choose an algorithm without a critic (grpo, rloo...)"
        )
    if algorithm.use_teacher:
        problems.append(
            f"{name} scores with a teacher model loaded here, beside a policy that a Tinker run "
            "keeps in the service (model.tinker.enable); choose an algorithm without a teacher"
        )
    entropy = ENTROPY_LOSS_FN.get(algo.entropy_loss_fn)(**algo.entropy_loss_fn_args)
    if not entropy_term_is_zero(entropy):
        problems.append(
            f"algorithm.entropy_loss_fn = {algo.entropy_loss_fn} "
            f"({algo.entropy_loss_fn_args}): the Tinker API returns the sampled tokens' "
            "logprobs, not the entropy of the distribution; set entropy_loss_fn: none (or "
            "entropy_coef: 0)"
        )
    if getattr(advantage_fn_class(config), "needs_policy_scores", False):
        problems.append(
            f"algorithm.advantage_fn = {algo.advantage_fn} reads the entropy of the policy's "
            "distribution at each token, and the Tinker API returns the sampled tokens' "
            "logprobs only; choose another advantage fn with model.tinker.enable"
        )
    if algorithm.use_advantage and config.mode != "train":
        temperature = rollout_temperature(config)
        if temperature != 1.0:
            problems.append(
                f"the training rollouts' temperature is {temperature:g} "
                "(buffer.explorer_input.tasksets[0].rollout_args.temperature): the Tinker "
                "service scores at temperature 1, so the trainer's logprobs would not be the "
                "sampler's; set 1.0 with model.tinker.enable"
            )
    return problems


def _trainer_problems(config: Config) -> List[str]:
    trainer, problems = config.trainer, []
    if trainer.cpu_ranks > 1:
        problems.append(f"trainer.cpu_ranks = {trainer.cpu_ranks}: {SERVICE_TRAINS}; remove it (1)")
    if trainer.save_hf_checkpoint != "never":
        problems.append(
            f"trainer.save_hf_checkpoint = {trainer.save_hf_checkpoint}: a Tinker run's weights "
            "stay in the service (each checkpoint's extra.json names their path); set never"
        )
    return problems


def _explorer_problems(config: Config) -> List[str]:
    model, rollout, problems = config.model, config.explorer.rollout_model, []
    if rollout.engine_type != ENGINE:
        problems.append(
            f"explorer.rollout_model.engine_type = {rollout.engine_type}: with "
            "model.tinker.enable the trained weights live in the Tinker service, which only "
            "engine_type tinker samples; set tinker (or leave it unset)"
        )
    if model.repetition_penalty != 1.0:
        problems.append(
            f"model.repetition_penalty = {model.repetition_penalty:g}: the Tinker API has no "
            "repetition penalty; set 1.0 with engine_type tinker"
        )
    if model.min_response_tokens > 1:
        problems.append(
            f"model.min_response_tokens = {model.min_response_tokens}: the Tinker API has no "
            "minimum length; set 1 (or 0) with engine_type tinker"
        )
    return problems


def handover_problems(config: Config) -> List[str]:
    """A stage followed by another hands its final weights over as a local folder."""
    if not config.model.tinker.enable:
        return []
    return [
        "model.tinker.enable: the next stage would start from this stage's final weights, "
        "which stay in the Tinker service; run each Tinker stage as a run of its own"
    ]


def service_problems(config: Config) -> List[str]:
    """The key is set, the service answers (bounded attempts) and holds
    ``model.tinker.base_model``."""
    if not config.model.tinker.enable:
        return []
    if not os.environ.get(KEY_ENV):
        return [
            f"model.tinker.enable: the environment variable {KEY_ENV} is not set; the Tinker "
            "SDK sends it to the service (a service that checks no key takes any tml- value)"
        ]
    import httpx  # the tinker extra's, as the SDK's

    try:
        capabilities = probe()
        sdk = sdk_problem()
    except (TinkerUnavailable, PermissionError) as exc:
        return [f"model.tinker.enable: {exc}"]
    except httpx.HTTPError as exc:  # it answered the probe a moment ago
        return [f"model.tinker.enable: the Tinker service at {service_url()}: {exc}"]
    if sdk:
        return [f"model.tinker.enable: {sdk}"]
    problem = base_model_problem(
        capabilities, config.model.tinker.base_model, "model.tinker.base_model"
    )
    return [problem] if problem else []
