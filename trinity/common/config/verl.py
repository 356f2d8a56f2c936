"""``trainer.trainer_config``: the veRL keys users bring, typed, and what the native trainer uses.

The tree follows veRL's own config tree (docs/reference/verl.md). Keys the native PyTorch
trainer honours are plain fields; keys it cannot honour are declared with ``inert`` so they
load and are reported in a warning; keys that moved elsewhere in Trinity are listed in
``MOVED_KEYS`` so setting them is an error that names the new place.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Literal, Optional

from pydantic import Field

from trinity.common.config.base import ConfigModel, inert
from trinity.common.config.schema_algorithm import OptimizerConfig

_FSDP = "FSDP tuning of veRL; the native trainer shards and places weights itself"
_PADDING = "the native trainer computes on padded batches"
_KERNELS = "the native trainer uses the model's own kernels"
_ROLLOUT = "veRL rollout keys are not used (the explorer rolls out)"
_MEGATRON = "Megatron-LM settings of veRL; the Megatron backend is not supported yet."
LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
# veRL shuffles the mini-batches of a pass; here a pass is one update over the whole batch
_ONE_UPDATE = (
    "each ppo epoch is one optimizer step over the whole batch: row order cannot change it"
)


class VerlOptimConfig(OptimizerConfig):
    """``actor.optim``: veRL's optimizer block; user-set keys are copied to algorithm.optimizer."""

    total_training_steps: int = inert(
        -1, description="Total steps of the schedule.", reason="derived from buffer.total_steps"
    )


class CriticOptimConfig(VerlOptimConfig):
    """``critic.optim``: the critic's optimizer."""

    lr: float = Field(1e-5, description="Critic learning rate.")


class VerlWrapPolicy(ConfigModel):
    """``fsdp_config.wrap_policy``."""

    transformer_layer_cls_to_wrap: Optional[List[str]] = Field(
        None, description="Layer classes wrapped as FSDP units."
    )
    min_num_params: int = Field(0, description="Size-based wrapping threshold.")


Precision = Literal["fp32", "bf16", "fp16", "float32", "bfloat16", "float16"]


class VerlMixedPrecision(ConfigModel):
    """``fsdp_config.mixed_precision``: the dtypes the trainer computes in."""

    param_dtype: Optional[Precision] = Field(
        None,
        description="Compute dtype of forward and backward (autocast over fp32 master "
        "weights); unset: bf16 on a GPU, fp32 on CPU.",
    )
    reduce_dtype: Precision = Field(
        "fp32", description="dtype of gradients and their reduction across ranks."
    )
    buffer_dtype: Precision = Field("fp32", description="dtype of model buffers.")


class VerlFSDPConfig(ConfigModel):
    """``fsdp_config`` of actor, ref and critic."""

    mixed_precision: VerlMixedPrecision = Field(
        default_factory=VerlMixedPrecision, description="Compute dtypes."
    )
    wrap_policy: VerlWrapPolicy = inert(
        default_factory=VerlWrapPolicy, description="Wrapping.", reason=_FSDP
    )
    param_offload: bool = inert(False, description="Offload parameters to CPU.", reason=_FSDP)
    optimizer_offload: bool = inert(
        False, description="Offload optimizer state to CPU.", reason=_FSDP
    )
    fsdp_size: int = inert(-1, description="Ranks per FSDP group; -1 is all.", reason=_FSDP)
    forward_prefetch: bool = inert(
        False, description="Prefetch the next unit's weights.", reason=_FSDP
    )


class VerlCheckpointContents(ConfigModel):
    """``actor.checkpoint``."""

    load_contents: List[str] = Field(
        default_factory=lambda: ["model", "optimizer", "extra"], description="What to load."
    )
    save_contents: List[str] = Field(
        default_factory=lambda: ["model", "optimizer", "extra"], description="What to save."
    )


class VerlFusedKernelOptions(ConfigModel):
    """``model.fused_kernel_options``."""

    impl_backend: Optional[str] = Field(None, description="triton or torch.")


class VerlModelConfig(ConfigModel):
    """``actor_rollout_ref.model``."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {"path": "model.model_path"}

    external_lib: Optional[str] = inert(
        None, description="Module imported to register models.", reason="use a plugin instead"
    )
    override_config: Dict[str, Any] = inert(
        default_factory=dict, description="HF config overrides.", reason="not applied"
    )
    enable_gradient_checkpointing: bool = Field(
        True, description="Recompute activations in backward to save memory."
    )
    use_remove_padding: bool = inert(True, description="Unpad sequences.", reason=_PADDING)
    use_fused_kernels: bool = inert(False, description="Fused kernels.", reason=_KERNELS)
    fused_kernel_options: VerlFusedKernelOptions = inert(
        default_factory=VerlFusedKernelOptions, description="Fused kernels.", reason=_KERNELS
    )
    enable_activation_offload: bool = inert(
        False, description="Offload activations to CPU.", reason=_FSDP
    )
    trust_remote_code: bool = inert(
        False, description="Run model code from the hub.", reason="models load without remote code"
    )


class VerlActorConfig(ConfigModel):
    """``actor_rollout_ref.actor``."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {
        "ppo_micro_batch_size": "ppo_micro_batch_size_per_gpu",
    }

    strategy: str = inert(
        "fsdp", description="veRL backend.", reason="use trainer.trainer_strategy"
    )
    ppo_micro_batch_size_per_gpu: int = Field(4, ge=1, description="Sequences per forward pass.")
    use_dynamic_bsz: bool = Field(
        True, description="Pack micro batches by tokens; copied to trainer.use_dynamic_bsz."
    )
    ppo_max_token_len_per_gpu: int = Field(
        16384, description="Token budget of a packed micro batch; copied to trainer."
    )
    grad_clip: float = Field(1.0, description="Gradient norm clip; copied to trainer.grad_clip.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each training batch.")
    shuffle: bool = inert(
        False, description="Shuffle the batch between passes.", reason=_ONE_UPDATE
    )
    ulysses_sequence_parallel_size: int = Field(
        1, ge=1, description="Sequence parallel degree (run as 1 here: whole sequences)."
    )
    entropy_from_logits_with_chunking: bool = inert(
        False, description="Chunked entropy.", reason=_KERNELS
    )
    entropy_checkpointing: bool = inert(False, description="Recompute entropy.", reason=_KERNELS)
    checkpoint: VerlCheckpointContents = inert(
        default_factory=VerlCheckpointContents,
        description="Checkpoint contents.",
        reason="checkpoints always hold model, optimizer and extra state",
    )
    optim: VerlOptimConfig = Field(
        default_factory=VerlOptimConfig, description="Copied to algorithm.optimizer."
    )
    fsdp_config: VerlFSDPConfig = Field(
        default_factory=VerlFSDPConfig, description="FSDP settings; mixed_precision is used."
    )
    # veRL's loss keys: each is carried to the algorithm setting named in its description
    # (verl_mapping.ACTOR_LOSS_KEYS), where the algorithm's component takes that argument.
    clip_ratio: Optional[float] = Field(
        None, description="PPO clip range; carried to algorithm.policy_loss_fn_args.clip_range."
    )
    clip_ratio_low: Optional[float] = Field(
        None, description="Lower clip; carried to algorithm.policy_loss_fn_args.clip_range_low."
    )
    clip_ratio_high: Optional[float] = Field(
        None, description="Upper clip; carried to algorithm.policy_loss_fn_args.clip_range_high."
    )
    clip_ratio_c: Optional[float] = Field(
        None, description="Dual-clip bound; carried to algorithm.policy_loss_fn_args.clip_ratio_c."
    )
    loss_agg_mode: Optional[LossAggMode] = Field(
        None, description="Loss aggregation; carried to algorithm.loss_agg_mode."
    )
    entropy_coeff: Optional[float] = Field(
        None,
        description="Entropy bonus weight; carried to algorithm.entropy_loss_fn_args.entropy_coef.",
    )
    use_kl_loss: Optional[bool] = Field(
        None,
        description="KL loss on or off; carried to algorithm.kl_loss_fn (false: none; true: "
        "the estimator kl_loss_type names).",
    )
    kl_loss_type: Optional[str] = Field(
        None,
        description="KL loss estimator (kl, k1, abs, mse, k2, k3, low_var_kl), with use_kl_loss.",
    )
    kl_loss_coef: Optional[float] = Field(
        None,
        description="KL loss weight; carried to algorithm.kl_loss_fn_args.kl_coef (dpo: "
        "policy_loss_fn_args.beta, as Trinity-RFT 0.1.1 read it).",
    )
    tau: Optional[float] = Field(
        None,
        description="OPMD's regularization (Trinity-RFT 0.1.1); carried to the tau of "
        "algorithm.policy_loss_fn_args and advantage_fn_args.",
    )
    opmd_baseline: Optional[str] = Field(
        None,
        description="OPMD's baseline (Trinity-RFT 0.1.1); carried to "
        "algorithm.advantage_fn_args.opmd_baseline.",
    )
    megatron: Optional[Dict[str, Any]] = Field(None, description=_MEGATRON)


class VerlRefConfig(ConfigModel):
    """``actor_rollout_ref.ref``: the reference model's forward passes."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {
        "log_prob_micro_batch_size": "log_prob_micro_batch_size_per_gpu"
    }

    fsdp_config: VerlFSDPConfig = Field(
        default_factory=VerlFSDPConfig, description="FSDP settings; mixed_precision is used."
    )
    log_prob_micro_batch_size_per_gpu: int = Field(
        4, ge=1, description="Sequences per forward pass."
    )
    log_prob_use_dynamic_bsz: Optional[bool] = Field(
        None, description="Pack by tokens; unset: trainer.use_dynamic_bsz."
    )
    log_prob_max_token_len_per_gpu: Optional[int] = Field(
        None, description="Token budget; unset: trainer.max_token_len_per_gpu."
    )
    ulysses_sequence_parallel_size: Optional[int] = Field(
        None, ge=1, description="Sequence parallel degree; unset: the actor's."
    )
    entropy_from_logits_with_chunking: Optional[bool] = inert(
        None, description="Chunked entropy.", reason=_KERNELS
    )
    entropy_checkpointing: Optional[bool] = inert(
        None, description="Recompute entropy.", reason=_KERNELS
    )
    megatron: Optional[Dict[str, Any]] = Field(None, description=_MEGATRON)


def _rollout_key(home: str, description: str) -> Any:
    return inert(None, description=description, reason=f"{_ROLLOUT}; set {home}")


_TASKSET_ARGS = "buffer.explorer_input.tasksets[i].rollout_args"
_ROLLOUT_MODEL = "explorer.rollout_model"
_NOT_USED = "nothing (not used)"


class VerlRolloutConfig(ConfigModel):
    """``actor_rollout_ref.rollout``: accepted for compatibility, never used."""

    name: Optional[str] = _rollout_key(f"{_ROLLOUT_MODEL}.engine_type", "Engine.")
    temperature: Optional[float] = _rollout_key(f"{_TASKSET_ARGS}.temperature", "Temperature.")
    top_k: Optional[int] = _rollout_key(f"{_TASKSET_ARGS}.top_k", "Top-k.")
    top_p: Optional[float] = _rollout_key(f"{_TASKSET_ARGS}.top_p", "Top-p.")
    n: Optional[int] = _rollout_key("algorithm.repeat_times", "Samples per prompt.")
    prompt_length: Optional[int] = _rollout_key("model.max_prompt_tokens", "Prompt length.")
    response_length: Optional[int] = _rollout_key("model.max_response_tokens", "Response length.")
    dtype: Optional[str] = _rollout_key(f"{_ROLLOUT_MODEL}.dtype", "Weights dtype.")
    gpu_memory_utilization: Optional[float] = _rollout_key(
        f"{_ROLLOUT_MODEL}.gpu_memory_utilization", "GPU memory fraction."
    )
    tensor_model_parallel_size: Optional[int] = _rollout_key(
        f"{_ROLLOUT_MODEL}.tensor_parallel_size", "Tensor parallel degree."
    )
    enforce_eager: Optional[bool] = _rollout_key(f"{_ROLLOUT_MODEL}.enforce_eager", "No graphs.")
    ignore_eos: Optional[bool] = _rollout_key(_NOT_USED, "Continue after EOS.")
    free_cache_engine: Optional[bool] = _rollout_key(_NOT_USED, "Free the KV cache.")
    load_format: Optional[str] = _rollout_key(_NOT_USED, "Weight loader.")
    max_num_batched_tokens: Optional[int] = _rollout_key(_NOT_USED, "vLLM batch tokens.")
    max_num_seqs: Optional[int] = _rollout_key(_NOT_USED, "vLLM batch sequences.")
    log_prob_micro_batch_size: Optional[int] = _rollout_key(_NOT_USED, "Micro batch.")
    log_prob_micro_batch_size_per_gpu: Optional[int] = _rollout_key(
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "Micro batch per GPU."
    )
    log_prob_use_dynamic_bsz: Optional[bool] = _rollout_key(_NOT_USED, "Pack by tokens.")
    log_prob_max_token_len_per_gpu: Optional[int] = _rollout_key(_NOT_USED, "Token budget.")
    do_sample: Optional[bool] = _rollout_key(f"{_TASKSET_ARGS}.temperature", "Sample or greedy.")
    engine_kwargs: Optional[Dict[str, Any]] = _rollout_key(_NOT_USED, "Engine arguments.")
    val_kwargs: Optional[Dict[str, Any]] = _rollout_key(
        "buffer.explorer_input.eval_tasksets[i].rollout_args", "Validation sampling."
    )


class VerlActorRolloutRefConfig(ConfigModel):
    """``actor_rollout_ref``."""

    hybrid_engine: bool = inert(
        True,
        description="Actor and rollout share GPUs.",
        reason="explorer and trainer are separate",
    )
    model: VerlModelConfig = Field(default_factory=VerlModelConfig, description="Actor model.")
    actor: VerlActorConfig = Field(default_factory=VerlActorConfig, description="Actor training.")
    ref: VerlRefConfig = Field(default_factory=VerlRefConfig, description="Reference model.")
    rollout: VerlRolloutConfig = Field(
        default_factory=VerlRolloutConfig, description="Not used; see explorer."
    )


class VerlCriticModelConfig(ConfigModel):
    """``critic.model``."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {"path": "model.critic_model_path"}

    override_config: Dict[str, Any] = inert(
        default_factory=dict, description="HF config overrides.", reason="not applied"
    )
    external_lib: Optional[str] = inert(
        None, description="Module imported to register models.", reason="use a plugin instead"
    )
    enable_gradient_checkpointing: bool = Field(True, description="Recompute activations.")
    use_remove_padding: bool = inert(False, description="Unpad sequences.", reason=_PADDING)
    fsdp_config: VerlFSDPConfig = Field(
        default_factory=VerlFSDPConfig, description="FSDP settings; mixed_precision is used."
    )


class VerlCriticConfig(ConfigModel):
    """``critic``: stored for the critic model (built by a later issue)."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {"ppo_micro_batch_size": "ppo_micro_batch_size_per_gpu"}

    strategy: str = inert(
        "fsdp", description="veRL backend.", reason="use trainer.trainer_strategy"
    )
    optim: CriticOptimConfig = Field(
        default_factory=CriticOptimConfig, description="Critic optimizer."
    )
    model: VerlCriticModelConfig = Field(
        default_factory=VerlCriticModelConfig, description="Critic model."
    )
    ppo_micro_batch_size_per_gpu: int = Field(8, description="Sequences per training pass.")
    forward_micro_batch_size_per_gpu: Optional[int] = Field(
        None, description="Sequences per value pass; unset: ppo_micro_batch_size_per_gpu."
    )
    use_dynamic_bsz: Optional[bool] = Field(
        None, description="Pack by tokens; unset: trainer.use_dynamic_bsz."
    )
    ppo_max_token_len_per_gpu: int = Field(32768, description="Token budget per training pass.")
    forward_max_token_len_per_gpu: Optional[int] = Field(
        None, description="Token budget per value pass; unset: ppo_max_token_len_per_gpu."
    )
    ulysses_sequence_parallel_size: int = Field(
        1, ge=1, description="Sequence parallel degree (run as 1 here: whole sequences)."
    )
    ppo_epochs: Optional[int] = Field(None, description="Passes per batch; unset: the actor's.")
    shuffle: Optional[bool] = inert(
        None, description="Shuffle between passes; unset: the actor's.", reason=_ONE_UPDATE
    )
    grad_clip: float = Field(1.0, description="Critic gradient norm clip.")
    cliprange_value: float = Field(0.5, description="Value clipping range of the value loss.")
    megatron: Optional[Dict[str, Any]] = Field(None, description=_MEGATRON)


class VerlTrainerSection(ConfigModel):
    """``trainer`` inside trainer_config (veRL's trainer block)."""

    balance_batch: bool = Field(True, description="Balance tokens across data-parallel ranks.")
    critic_warmup: int = Field(0, description="Steps that train only the critic.")
    resume_mode: str = inert(
        "auto", description="Resume behaviour.", reason="use continue_from_checkpoint"
    )
    resume_from_path: str = inert(
        "", description="Checkpoint to resume.", reason="use continue_from_checkpoint"
    )
    default_hdfs_dir: Optional[str] = inert(
        None, description="HDFS checkpoint dir.", reason="checkpoints go to checkpoint_root_dir"
    )
    remove_previous_ckpt_in_save: bool = inert(
        False, description="Delete old checkpoints.", reason="use trainer.max_checkpoints_to_keep"
    )
    del_local_ckpt_after_load: bool = inert(
        False, description="Delete after loading.", reason="checkpoints are kept"
    )
    max_actor_ckpt_to_keep: Optional[int] = inert(
        5, description="Actor checkpoints kept.", reason="use trainer.max_checkpoints_to_keep"
    )
    max_critic_ckpt_to_keep: Optional[int] = inert(
        5, description="Critic checkpoints kept.", reason="use trainer.max_checkpoints_to_keep"
    )


class VerlAlgorithmConfig(ConfigModel):
    """``trainer_config.algorithm``: veRL's algorithm keys, each carried to the Trinity
    algorithm setting its description names (verl_mapping.py)."""

    gamma: Optional[float] = Field(
        None, description="GAE discount; carried to algorithm.advantage_fn_args.gamma."
    )
    lam: Optional[float] = Field(
        None, description="GAE lambda; carried to algorithm.advantage_fn_args.lam."
    )
    norm_adv_by_std_in_grpo: Optional[bool] = Field(
        None, description="Carried to algorithm.advantage_fn_args.norm_adv_by_std_in_grpo."
    )
    adv_estimator: Optional[str] = Field(
        None,
        description="veRL's advantage estimator; algorithm.algorithm_type and advantage_fn "
        "decide it here (Trinity-RFT overwrote it too), so a different one is reported.",
    )
    use_kl_in_reward: Optional[bool] = Field(
        None,
        description="KL penalty in the reward on or off; carried to algorithm.kl_penalty_fn "
        "(unset with kl_penalty or kl_ctrl set: on unless the actor's use_kl_loss is true, "
        "the rule of Trinity-RFT 0.1.1 and veRL then).",
    )
    kl_penalty: Optional[str] = Field(
        None, description="Estimator of the KL penalty; carried to algorithm.kl_penalty_fn."
    )
    kl_ctrl: Optional[Dict[str, Any]] = Field(
        None,
        description="Fixed or adaptive KL coefficient (type, kl_coef, horizon, target_kl); "
        "carried to algorithm.kl_penalty_fn_args.kl_ctrl.",
    )
    rollout_correction: Optional[Dict[str, Any]] = Field(
        None, description="Carried key by key to algorithm.rollout_correction."
    )


class VerlTrainerConfig(ConfigModel):
    """``trainer.trainer_config``: the veRL key tree."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {
        "data": "buffer.explorer_input",
        "reward_model": "explorer.auxiliary_models",
    }

    algorithm: VerlAlgorithmConfig = Field(
        default_factory=VerlAlgorithmConfig, description="veRL's algorithm keys."
    )

    actor_rollout_ref: VerlActorRolloutRefConfig = Field(
        default_factory=VerlActorRolloutRefConfig, description="Actor, reference, rollout."
    )
    critic: VerlCriticConfig = Field(default_factory=VerlCriticConfig, description="Critic.")
    trainer: VerlTrainerSection = Field(
        default_factory=VerlTrainerSection, description="veRL trainer loop keys."
    )
