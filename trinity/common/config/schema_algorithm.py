"""``algorithm``: the RL algorithm and its optimizer."""

from __future__ import annotations

import logging
from typing import Any, Dict, Literal, Optional, Tuple

from pydantic import Field, model_validator

from trinity.common.config.base import ConfigModel

logger = logging.getLogger("trinity.config")


class OptimizerConfig(ConfigModel):
    """``algorithm.optimizer``: the actor's optimizer and learning-rate schedule."""

    lr: float = Field(1e-6, ge=0.0, description="Learning rate.")
    lr_warmup_steps: int = Field(
        -1, description="Linear warm-up steps; negative means use lr_warmup_steps_ratio."
    )
    lr_warmup_steps_ratio: float = Field(
        0.0, ge=0.0, le=1, description="Warm-up steps as a fraction of the total training steps."
    )
    min_lr_ratio: float = Field(
        0.0, ge=0.0, le=1, description="Cosine schedule: the final lr as a fraction of lr."
    )
    warmup_style: Optional[Literal["constant", "cosine"]] = Field(
        None, description="Deprecated alias of lr_scheduler_type."
    )
    lr_scheduler_type: Literal["constant", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warm-up."
    )
    num_cycles: float = Field(0.5, description="Cosine schedule: number of cosine cycles.")
    optimizer_type: str = Field("adamw", description="Optimizer; only adamw is built.")
    betas: Tuple[float, float] = Field((0.9, 0.999), description="Adam betas.")
    weight_decay: float = Field(0.01, ge=0.0, description="Decoupled weight decay.")

    @model_validator(mode="after")
    def _apply_warmup_style(self) -> OptimizerConfig:
        if self.warmup_style is None:
            return self
        if "lr_scheduler_type" in self.model_fields_set and (
            self.lr_scheduler_type != self.warmup_style
        ):
            raise ValueError(
                f"warmup_style = {self.warmup_style} conflicts with lr_scheduler_type = "
                f"{self.lr_scheduler_type}; warmup_style is deprecated, keep only lr_scheduler_type"
            )
        logger.warning(
            "optimizer.warmup_style is deprecated; use lr_scheduler_type (now %s)",
            self.warmup_style,
        )
        self.lr_scheduler_type = self.warmup_style
        # The alias is consumed: saved configs and stage merges carry lr_scheduler_type only.
        self.warmup_style = None
        self.model_fields_set.discard("warmup_style")
        return self


class AlgorithmConfig(ConfigModel):
    """``algorithm``: which algorithm, and its components.

    Component keys left unset take the values of ``ALGORITHM_TYPE[algorithm_type]
    .default_config()``; each ``*_args`` is merged over its component's ``default_args()``.
    """

    algorithm_type: str = Field(
        "grpo", description="Registered algorithm name (grpo, ppo, rloo, dpo, sft, mix, ...)."
    )
    repeat_times: int = Field(
        1, ge=1, description="Rollouts per task; unset: the algorithm's default."
    )
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="Actor optimizer."
    )
    sample_strategy: Optional[str] = Field(
        None, description="How the trainer reads experiences; unset: the algorithm's default."
    )
    sample_strategy_args: Dict[str, Any] = Field(
        default_factory=dict, description="Arguments of the sample strategy."
    )
    advantage_fn: Optional[str] = Field(
        None, description="Advantage function; unset: the algorithm's default."
    )
    advantage_fn_args: Dict[str, Any] = Field(
        default_factory=dict, description="Arguments of the advantage function."
    )
    policy_loss_fn: Optional[str] = Field(
        None, description="Policy loss function; unset: the algorithm's default."
    )
    policy_loss_fn_args: Dict[str, Any] = Field(
        default_factory=dict, description="Arguments of the policy loss function."
    )
    kl_penalty_fn: Optional[str] = Field(
        None, description="KL estimator subtracted from rewards; unset: the algorithm's default."
    )
    kl_penalty_fn_args: Dict[str, Any] = Field(
        default_factory=dict, description="Arguments of the KL penalty, e.g. kl_coef."
    )
    kl_loss_fn: Optional[str] = Field(
        None, description="KL estimator added to the loss; unset: the algorithm's default."
    )
    kl_loss_fn_args: Dict[str, Any] = Field(
        default_factory=dict, description="Arguments of the KL loss, e.g. kl_coef."
    )
    entropy_loss_fn: Optional[str] = Field(
        None, description="Entropy loss function; unset: the algorithm's default."
    )
    entropy_loss_fn_args: Dict[str, Any] = Field(
        default_factory=dict, description="Arguments of the entropy loss, e.g. entropy_coef."
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = Field("token-mean", description="How per-token losses become one number, for all losses.")
