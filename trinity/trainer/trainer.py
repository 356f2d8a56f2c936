"""Trainer: reads experiences through the sample strategy, updates the policy, saves, syncs."""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM_TYPE,
    ENTROPY_LOSS_FN,
    KL_FN,
    POLICY_LOSS_FN,
    SAMPLE_STRATEGY,
)
from trinity.algorithm.algorithm import needs_reference
from trinity.algorithm.optimizer import build_lr_scheduler, build_optimizer
from trinity.common.config import effective_trainer_settings
from trinity.common.experience import Experience, ExperienceBatch
from trinity.trainer import checkpoint as ckpt
from trinity.trainer.policy_step import LossFns, accumulate_gradients, reference_logprobs

logger = logging.getLogger(__name__)


def _stats(prefix: str, values: torch.Tensor) -> Dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


class Trainer:
    def __init__(
        self,
        config: Any,
        planned_steps: int,
        log: Callable[[Dict[str, float], int], None],
        publish: Optional[Callable[[int, torch.nn.Module], None]] = None,
    ) -> None:
        """``publish(version, model)`` hands weights to the explorer; ``planned_steps`` sizes the
        lr schedule and bounds the loop. Call ``prepare_model`` then ``attach_reader``."""
        self.config = config
        self.planned_steps = planned_steps
        self.log = log
        self.publish = publish
        self.job_dir = config.checkpoint_job_dir
        self.step = 0

    # ---- setup ---------------------------------------------------------------------------
    def prepare_model(self) -> int:
        """Load model, optimizer, algorithm; resume from the last checkpoint if asked."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg, algo = self.config, self.config.algorithm
        path = cfg.model.model_path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.settings = effective_trainer_settings(cfg)
        if self.settings["enable_gradient_checkpointing"]:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.algorithm = ALGORITHM_TYPE.get(algo.algorithm_type)
        self.ref_model = None
        if needs_reference(self.algorithm, algo.kl_loss_fn, algo.kl_penalty_fn):
            self.ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            self.ref_model.requires_grad_(False)
        self.optimizer = build_optimizer(self.model.parameters(), algo.optimizer)
        self.scheduler = build_lr_scheduler(self.optimizer, algo.optimizer, self.planned_steps)
        self.fns = LossFns(
            policy_loss=POLICY_LOSS_FN.get(algo.policy_loss_fn)(**algo.policy_loss_fn_args),
            kl_loss=KL_FN.get(algo.kl_loss_fn)(**algo.kl_loss_fn_args),
            entropy_loss=ENTROPY_LOSS_FN.get(algo.entropy_loss_fn)(**algo.entropy_loss_fn_args),
            temperature=cfg.buffer.explorer_input.taskset.rollout_args.temperature
            if self.algorithm.use_advantage
            else 1.0,
        )
        self.fns.loss_agg_mode = self.fns.policy_loss.loss_agg_mode
        self.kl_penalty = KL_FN.get(algo.kl_penalty_fn)(**algo.kl_penalty_fn_args)
        self.advantage_fn = (
            ADVANTAGE_FN.get(algo.advantage_fn)(**algo.advantage_fn_args)
            if self.algorithm.use_advantage
            else None
        )
        self._sampler_state: Dict[str, Any] = {}
        if cfg.continue_from_checkpoint and ckpt.latest_step(self.job_dir) is not None:
            self._resume(ckpt.latest_step(self.job_dir))
        return self.step

    def attach_reader(self, reader: Any) -> None:
        """Connect the experience source (SFT data needs the tokenizer, so after the model)."""
        algo = self.config.algorithm
        self.reader = reader
        self.sampler = SAMPLE_STRATEGY.get(algo.sample_strategy)(
            reader, **algo.sample_strategy_args
        )
        self.sampler.load_state_dict(self._sampler_state)

    def _resume(self, step: int) -> None:
        state = ckpt.load_checkpoint(self.job_dir, step)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"]["optimizer"])
        self.scheduler.load_state_dict(state["optim"]["scheduler"])
        self._sampler_state = state["extra"].get("sample_strategy", {})
        self.step = step
        logger.info("resumed the trainer from %s", ckpt.step_dir(self.job_dir, step))

    # ---- one step --------------------------------------------------------------------------
    def train_step(self, experiences: List[Experience]) -> Dict[str, float]:
        start = time.monotonic()
        settings = self.settings
        mbs = settings["micro_batch_size_per_device"]
        max_tokens = settings["max_token_len_per_device"] if settings["use_dynamic_bsz"] else None
        ref_tokens = (
            settings["ref_max_token_len_per_device"] if settings["ref_use_dynamic_bsz"] else None
        )
        batch = ExperienceBatch.from_experiences(experiences, self.tokenizer.pad_token_id)
        metrics: Dict[str, float] = {}
        if self.ref_model is not None:
            batch.ref_logprob = reference_logprobs(
                self.ref_model,
                batch,
                settings["ref_micro_batch_size_per_device"],
                self.fns.temperature,
                ref_tokens,
            )
        if self.advantage_fn is not None:
            batch, kl_metrics = self.kl_penalty.apply_kl_penalty_to_reward(batch)
            batch, adv_metrics = self.advantage_fn(batch)
            metrics.update(kl_metrics)
            metrics.update(adv_metrics)
        for _ in range(settings["ppo_epochs"]):
            self.optimizer.zero_grad(set_to_none=True)
            totals = accumulate_gradients(self.model, batch, self.fns, mbs, max_tokens)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), settings["grad_clip"]
            )
            if torch.isfinite(grad_norm):
                self.optimizer.step()
            else:
                logger.warning("step %d: non-finite grad norm, update skipped", self.step + 1)
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        metrics.update({f"actor/{k}": v for k, v in totals.items()})
        metrics["actor/grad_norm"] = float(grad_norm)
        metrics.update(self._batch_metrics(batch))
        metrics["time/train_step"] = time.monotonic() - start
        return metrics

    def _batch_metrics(self, batch: ExperienceBatch) -> Dict[str, float]:
        resp_len = batch.action_mask.sum(-1)
        prompt_len = torch.tensor([e.prompt_length for e in batch.experiences])
        max_tokens = self.config.model.max_response_tokens
        metrics = {**_stats("critic/rewards", batch.rewards), **_stats("response_length", resp_len)}
        metrics["response_length/clip_ratio"] = (resp_len >= max_tokens).float().mean().item()
        metrics.update(_stats("prompt_length", prompt_len))
        if batch.advantages is not None:
            mask = batch.action_mask.bool()
            metrics.update(_stats("critic/advantages", batch.advantages[mask]))
            metrics.update(_stats("critic/returns", batch.returns[mask]))
        return metrics

    # ---- loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Train until the buffer runs out or ``planned_steps`` is done; returns the last step."""
        cfg = self.config
        interval = cfg.synchronizer.sync_interval
        while self.step < self.planned_steps:
            try:
                experiences, sample_metrics = self.sampler.sample(
                    self.step + 1, cfg.buffer.train_batch_size
                )
            except StopIteration:
                break
            if not experiences:
                break
            self.step += 1
            metrics = {**sample_metrics, **self.train_step(experiences)}
            self.log(metrics, self.step)
            if self.publish is not None and self.step % interval == 0:
                self.publish(self.step, self.model)
            if cfg.trainer.save_interval and self.step % cfg.trainer.save_interval == 0:
                self.save(final=False)
        self.save(final=True)
        if self.publish is not None:
            self.publish(self.step, self.model)
        return self.step

    def save(self, final: bool) -> None:
        """Save the current step (once); HF export per ``trainer.save_hf_checkpoint``."""
        if self.step == 0:
            return
        if ckpt.latest_step(self.job_dir) != self.step:
            ckpt.save_checkpoint(
                self.job_dir,
                self.step,
                self.model,
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                },
                {"sample_strategy": self.sampler.state_dict()},
                max_to_keep=self.config.trainer.max_checkpoints_to_keep,
            )
        mode = self.config.trainer.save_hf_checkpoint
        hf_dir = os.path.join(ckpt.step_dir(self.job_dir, self.step), "hf")
        if (mode == "always" or (final and mode == "last")) and not os.path.isdir(hf_dir):
            self.export_hf(hf_dir)

    def export_hf(self, out_dir: str) -> None:
        """Write a folder ``AutoModelForCausalLM.from_pretrained`` loads, whole or not at all."""
        tmp = out_dir + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        os.replace(tmp, out_dir)
