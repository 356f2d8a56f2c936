"""The trainer on one of several ranks (``trainer.cpu_ranks``): FSDP2 shards, one batch.

Every rank runs the same loop as a 1-rank ``Trainer`` and makes the same collective calls
in the same order (``distributed.py``); rank 0 alone reads the buffer, logs and publishes.
A step: rank 0 samples and sends the experiences to the others; every rank builds the full
batch, scores its own rows with the frozen models (gathered back into the full batch),
computes the same advantages, and accumulates gradients over its own rows with shares of
the whole batch; the clipped update is the 1-rank update.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from trinity.common.experience import Experience, ExperienceBatch
from trinity.trainer import checkpoint as ckpt
from trinity.trainer.distributed import (
    Lockstep,
    RankGroup,
    broadcast_experiences,
    full_state_dict,
    gather_rows,
    shard,
    split_rows,
)
from trinity.trainer.policy_step import accumulate_gradients, response_scores
from trinity.trainer.sharded_checkpoint import load_sharded, save_sharded
from trinity.trainer.trainer import UNLOGGED_KEY, Trainer

logger = logging.getLogger(__name__)


class ShardedTrainer(Trainer):
    """A ``Trainer`` whose models are sharded over ``ranks`` (one process per rank)."""

    def __init__(
        self,
        config: Any,
        planned_steps: int,
        log: Callable[[Dict[str, float], int], None],
        publish: Optional[Callable[[int, torch.nn.Module], None]] = None,
        report: Optional[Callable[[str], None]] = None,
        *,
        ranks: RankGroup,
    ) -> None:
        """As ``Trainer``; ``log``, ``publish`` and ``report`` act on rank 0 only, but
        ``publish`` is called on every rank (its gathering is collective)."""
        super().__init__(config, planned_steps, log, publish, report)
        self.ranks = ranks
        self._hf_weights: Optional[Dict[str, torch.Tensor]] = None

    def _distribute(self, model: torch.nn.Module) -> torch.nn.Module:
        return shard(model, self.ranks)

    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """The whole weights on rank 0 (collective; empty on the other ranks)."""
        return full_state_dict(self.model)

    # ---- the batch, split ------------------------------------------------------------------
    def _sample(self) -> Tuple[List[Experience], Dict[str, float]]:
        found = None
        if self.ranks.is_main:
            try:
                found = super()._sample()
            except StopIteration:
                found = None
        experiences = broadcast_experiences(self.ranks, None if found is None else list(found[0]))
        if experiences is None:
            raise StopIteration
        return experiences, found[1] if found is not None else {}

    def _shares(self, batch: ExperienceBatch) -> List[List[int]]:
        """Every rank's rows of ``batch`` (the same on every rank)."""
        tokens = batch.attention_mask.sum(-1).tolist()
        # trainer_config.trainer.balance_batch: false keeps contiguous runs of rows per rank
        balance = self.algorithm.can_balance_batch and self.settings["balance_batch"]
        return split_rows(tokens, self.ranks.world, balance, self.fns.row_multiple)

    def _own(self, batch: ExperienceBatch) -> Tuple[ExperienceBatch, Lockstep]:
        """This rank's rows, and the lockstep of this batch (row 0 as the filler)."""
        shares = self._shares(batch)
        return batch.select(shares[self.ranks.rank]), Lockstep(self.ranks, batch.select([0]))

    def _score_tokens(
        self, model: torch.nn.Module, batch: ExperienceBatch, with_entropy: bool
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        own, lockstep = self._own(batch)
        logprob, entropy = response_scores(
            model,
            own,
            self.settings["ref_micro_batch_size_per_device"],
            self.fns.temperature,
            self._tokens("ref_max_token_len_per_device", "ref_use_dynamic_bsz"),
            lockstep,
            with_entropy,
        )
        shares = self._shares(batch)  # every rank's rows back in batch order (collective)
        logprob = gather_rows(self.ranks, logprob, shares)
        if entropy is not None:
            entropy = gather_rows(self.ranks, entropy, shares)
        return logprob, entropy

    def _accumulate(
        self,
        batch: ExperienceBatch,
        max_tokens: Optional[int],
        scored: Optional[List[torch.Tensor]] = None,
    ) -> Dict[str, float]:
        own, lockstep = self._own(batch)
        micro_batch_size = self.settings["micro_batch_size_per_device"]
        local: Optional[List[torch.Tensor]] = [] if scored is not None else None
        totals = accumulate_gradients(
            self.model, own, self.fns, micro_batch_size, max_tokens, lockstep, keep=local
        )
        if scored is not None:  # every rank's rows, back in batch order (collective)
            mine = torch.cat(local) if local else own.old_logprob[:0]
            scored.append(gather_rows(self.ranks, mine, self._shares(batch)))
        return self.ranks.sum_metrics(totals)

    # ---- checkpoints -----------------------------------------------------------------------
    def _resume(self, step: int) -> None:
        state = load_sharded(self.ranks, self.job_dir, step, self.model, self.optimizer)
        self.scheduler.load_state_dict(state["optim"]["scheduler"])
        self._sampler_state = state["extra"].get("sample_strategy", {})
        self.kl_ctrl.load_state_dict(state["extra"].get("kl_ctrl", self.kl_ctrl.state_dict()))
        self.unlogged = state["extra"].get(UNLOGGED_KEY)
        self.step = step
        logger.info("resumed the trainer from %s", ckpt.step_dir(self.job_dir, step))

    def save(self, final: bool) -> None:
        """As ``Trainer.save``, collectively; rank 0 decides what is missing on disk."""
        if self.step == 0:
            return
        main = self.ranks.is_main
        if self.ranks.broadcast_json(main and ckpt.latest_step(self.job_dir) != self.step):
            extra = {"kl_ctrl": self.kl_ctrl.state_dict()}
            if main:
                extra.update(sample_strategy=self.sampler.state_dict(), **self._unlogged_extra())
            save_sharded(
                self.ranks,
                self.job_dir,
                self.step,
                self.model,
                self.optimizer,
                {"scheduler": self.scheduler.state_dict()},
                extra,
                max_to_keep=self.config.trainer.max_checkpoints_to_keep,
            )
        mode = self.config.trainer.save_hf_checkpoint
        hf_dir = os.path.join(ckpt.step_dir(self.job_dir, self.step), "hf")
        wanted = mode == "always" or (final and mode == "last")
        if self.ranks.broadcast_json(main and wanted and not os.path.isdir(hf_dir)):
            self.export_hf(hf_dir)

    def export_hf(self, out_dir: str) -> None:
        """Gather the whole weights (collective), then rank 0 writes the folder."""
        weights = self.full_state_dict()
        message = ""
        if self.ranks.is_main:
            self._hf_weights = weights
            try:
                super().export_hf(out_dir)
            except ckpt.CheckpointError as exc:
                message = str(exc)
            finally:
                self._hf_weights = None
        message = self.ranks.broadcast_json(message)
        if message:
            raise ckpt.CheckpointError(message)

    def _write_hf(self, out_dir: str) -> None:
        self.model.save_pretrained(out_dir, state_dict=self._hf_weights)
        self.tokenizer.save_pretrained(out_dir)
