"""``trainer``: the training loop, checkpoints, and the veRL-style ``trainer_config``."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from trinity.common.config.base import ConfigModel, Name, inert
from trinity.common.config.verl import VerlTrainerConfig


class TrainerConfig(ConfigModel):
    """``trainer``: how experiences become weight updates."""

    name: Name = Field(
        "trainer", description="Name of the trainer's Ray actor (or thread) and log/<name>.log."
    )
    trainer_type: Literal["verl"] = Field(
        "verl", description="Backend; verl, the only value, runs the native trainer."
    )
    trainer_strategy: Literal["fsdp", "fsdp2", "megatron"] = Field(
        "fsdp",
        description=(
            "Parallel strategy; fsdp and fsdp2 both mean FSDP2 (torch fully_shard). One trainer "
            "rank (the default) shards nothing; trainer.cpu_ranks > 1 shards the models over "
            "that many gloo ranks on CPU; GPU ranks and megatron are not supported yet."
        ),
    )
    cpu_ranks: int = Field(
        1,
        description=(
            "Trainer processes on a machine without GPUs, one gloo process group (FSDP2 "
            "shards the models over them); with GPUs the trainer is one process on one GPU."
        ),
    )
    total_steps: Optional[int] = Field(
        None, ge=1, description="Training steps; copied from/to buffer.total_steps."
    )
    save_interval: int = Field(
        0, ge=0, description="Save a checkpoint every this many steps; 0: last."
    )
    save_strategy: Literal["single_thread", "single_process", "single_node", "unrestricted"] = (
        inert(
            "unrestricted",
            description="Which savers may write at the same time.",
            reason="each checkpoint file has one writer (rank 0, or each rank its own shard)",
        )
    )
    save_hf_checkpoint: Literal["last", "always", "never"] = Field(
        "last", description="Which checkpoints are also exported in HF format."
    )
    grad_clip: float = Field(1.0, gt=0.0, description="Gradient norm clip.")
    use_dynamic_bsz: bool = Field(True, description="Pack micro batches up to a token budget.")
    max_token_len_per_gpu: Optional[int] = Field(
        None,
        ge=1,
        description="Token budget of a packed micro batch; unset: max(16384, model.max_model_len).",
    )
    ulysses_sequence_parallel_size: int = Field(
        1, ge=1, description="Sequence parallel degree (run as 1 here: whole sequences)."
    )
    max_checkpoints_to_keep: Optional[int] = Field(
        None, ge=1, description="Older checkpoints are deleted; null keeps all."
    )
    trainer_config: VerlTrainerConfig = Field(
        default_factory=VerlTrainerConfig, description="veRL keys (docs/reference/verl.md)."
    )
