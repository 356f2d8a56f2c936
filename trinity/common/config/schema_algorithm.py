"""``algorithm``: the RL algorithm and its optimizer."""

from __future__ import annotations

from typing import Any, Dict, Literal, Optional, Tuple

from pydantic import Field, ValidationInfo, field_validator

from trinity.common.config.base import ConfigModel


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
    lr_scheduler_type: Literal["constant", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warm-up."
    )
    num_cycles: float = Field(0.5, description="Cosine schedule: number of cosine cycles.")
    optimizer_type: str = Field("adamw", description="Optimizer; only adamw is built.")
    betas: Tuple[float, float] = Field((0.9, 0.999), description="Adam betas.")
    weight_decay: float = Field(0.01, ge=0.0, description="Decoupled weight decay.")


# rollout_correction keys that rollout_is / rollout_rs (the switch their name starts with)
# needs set, with what they mean, and keys that do nothing while it is null.
_REQUIRED = {
    "rollout_is_threshold": "the cap of the importance weights, e.g. 2.0",
    "rollout_rs_threshold": "the upper end of the kept ratio band, e.g. 2.0",
}
_IDLE = ("rollout_is_batch_normalize", "rollout_rs_threshold", "rollout_rs_threshold_lower")
_LEVELS = {"rollout_is": "token or sequence", "rollout_rs": "token, sequence or geometric"}


class RolloutCorrectionConfig(ConfigModel):
    """``algorithm.rollout_correction``: correct for the rollout engine's logprobs differing
    from the trainer's (veRL's keys; trinity/algorithm/rollout_correction.py has the math).

    With any of ``rollout_is``, ``rollout_rs`` or ``rollout_token_veto_threshold`` set, the
    trainer rescores each batch with the weights the explorer sampled from (one more forward
    pass), uses those logprobs as PPO's old logprobs, and weighs or masks each sampled token
    by its ratio ``pi_old / pi_rollout`` (veRL's decoupled mode).
    """

    rollout_is: Optional[Literal["token", "sequence"]] = Field(
        None,
        description="Truncated importance weight on the policy loss: each token's own ratio "
        "(token), its sequence's product of ratios (sequence), or none (null).",
    )
    rollout_is_threshold: Optional[float] = Field(
        2.0, ge=1.0, description="Upper cap of the importance weights (truncated IS)."
    )
    rollout_is_batch_normalize: bool = Field(
        False,
        description="Divide the capped weights by their batch mean (over tokens, or over "
        "sequences with rollout_is: sequence).",
    )
    rollout_rs: Optional[Literal["token", "sequence", "geometric"]] = Field(
        None,
        description="Reject (mask out of the loss) tokens whose ratio (token), or sequences "
        "whose product (sequence) or geometric mean (geometric) of ratios, is outside "
        "[rollout_rs_threshold_lower, rollout_rs_threshold]; null rejects nothing.",
    )
    rollout_rs_threshold: Optional[float] = Field(
        None,
        ge=1.0,
        validate_default=True,  # its check says it is missing when rollout_rs is set
        description="Upper end of the kept ratio band; required with rollout_rs.",
    )
    rollout_rs_threshold_lower: Optional[float] = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Lower end of the kept ratio band; null: 1 / rollout_rs_threshold.",
    )
    rollout_token_veto_threshold: Optional[float] = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Reject a whole sequence holding any token whose ratio is below this "
        "(e.g. 1e-4); null: no veto.",
    )
    bypass_mode: bool = Field(
        False,
        description="veRL's bypass mode (the engine's logprobs as PPO's old logprobs, no "
        "rescoring); only false, the decoupled mode, is built.",
    )
    use_policy_gradient: bool = Field(
        False,
        description="veRL's policy-gradient loss for bypass mode; only false is built.",
    )

    @property
    def enabled(self) -> bool:
        """Whether the trainer rescores batches and corrects them."""
        return (
            self.rollout_is is not None
            or self.rollout_rs is not None
            or self.rollout_token_veto_threshold is not None
        )

    @field_validator(*_REQUIRED, *_IDLE, mode="after")
    @classmethod
    def _needs_its_switch(cls, value: Any, info: ValidationInfo) -> Any:
        # Each switch is declared before the keys it governs, so info.data holds it; one
        # that failed its own check is missing there and reported alone.
        name = info.field_name or ""
        switch = "rollout_is" if name.startswith("rollout_is_") else "rollout_rs"
        if switch not in info.data:
            return value
        on = info.data[switch]
        if on is not None and value is None and name in _REQUIRED:
            raise ValueError(f"required with {switch} = {on} ({_REQUIRED[name]})")
        if on is None and name in _IDLE and value not in (None, False):
            shown = "true" if value is True else value
            raise ValueError(
                f"{shown} has no effect while {switch} is null: set {switch} "
                f"({_LEVELS[switch]}) or remove it"
            )
        return value


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
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="Importance weighting and rejection of sampled tokens by their ratio of "
        "trainer to rollout-engine probability.",
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = Field("token-mean", description="How per-token losses become one number, for all losses.")
