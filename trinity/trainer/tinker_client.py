"""The trainer with its policy in a Tinker service (``model.tinker.enable``), through the SDK.

``TinkerTrainer`` is the ``Trainer`` with what touches weights moved to the service: the
same loop, sample strategy, advantages, KL-in-reward, rollout correction and metrics run
here, on the batch, as they do in-process. What differs:

- the policy is a LoRA adapter (``model.tinker``: rank, seed, which layers) on the service's
  base model (``model.tinker.base_model``); ``model.model_path`` is only the tokenizer;
- an update is ``forward_backward`` (a built-in loss where one is exactly the run's loss,
  ``tinker_mapping.loss_plan``; else ``forward_backward_custom`` with this project's loss
  components on the logprobs the service returns) then ``optim_step`` with
  ``algorithm.optimizer`` at this step's scheduled lr and ``trainer.grad_clip``;
- scores: the policy's by ``forward`` (rollout correction, batch-level loss inputs), the
  reference's (the base model: a LoRA adapter's reference, as in-process) by a base-model
  sampling client's ``compute_logprobs``;
- weights reach the explorer as the path ``save_weights_for_sampler`` returns
  (``sampler_path``), and a checkpoint records the path ``save_state`` returns: a rerun
  resumes the same adapter and optimizer state from it (``create_training_client_from_state
  _with_optimizer``), with the lr schedule's step count.

The service computes logprobs at temperature 1, so an RL run samples at temperature 1
(checked before start, ``trinity/preflight/tinker_checks.py``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from trinity.algorithm.algorithm import needs_reference
from trinity.algorithm.optimizer import lr_factor_fn
from trinity.algorithm.rollout_correction import IS_WEIGHTS_KEY, mismatch_metrics
from trinity.common.experience import ExperienceBatch
from trinity.engine.tinker_service import service_client, wait_result
from trinity.trainer import checkpoint as ckpt
from trinity.trainer import tinker_mapping as mapping
from trinity.trainer.actor_batch import sampled_tokens
from trinity.trainer.policy_step import loss_inputs
from trinity.trainer.trainer import PolicyState, Trainer

logger = logging.getLogger(__name__)

TINKER_KEY = "tinker"  # in a checkpoint's extra.json: where the service keeps its state


class TinkerTrainer(Trainer):
    """``Trainer`` over a Tinker training client; see the module docstring."""

    # ---- setup ---------------------------------------------------------------------------
    def _load_models(self) -> None:
        from transformers import AutoTokenizer

        cfg, algo = self.config, self.config.algorithm
        self.device = torch.device("cpu")  # the batch's tensors; the model is the service's
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_path)
        self.lora, self.ref_is_base, self.teacher = None, False, None
        self.tinker = cfg.model.tinker
        self.service = service_client()
        # A run that resumes loads its adapter from the checkpoint's state instead.
        resumes = cfg.continue_from_checkpoint and ckpt.latest_step(self.job_dir) is not None
        self.model = None if resumes else self._create_client()
        self.ref_model = None
        if needs_reference(
            self.algorithm, algo.kl_loss_fn, algo.kl_penalty_fn, algo.policy_loss_fn
        ):
            # the reference of a LoRA policy is its base model
            self.ref_model = wait_result(
                self.service.create_sampling_client(base_model=self.tinker.base_model),
                f"creating a sampling client of the base model {self.tinker.base_model}",
            )
        self.lr_factor = lr_factor_fn(algo.optimizer, self.planned_steps)
        self.lr_steps = 0  # optimizer steps taken, as the in-process scheduler counts them
        self._samplers: Dict[int, str] = {}  # model version -> save_weights_for_sampler path

    def _create_client(self) -> Any:
        t = self.tinker
        return wait_result(
            self.service.create_lora_training_client(
                base_model=t.base_model,
                rank=t.rank,
                seed=t.seed,
                train_mlp=t.train_mlp,
                train_attn=t.train_attn,
                train_unembed=t.train_unembed,
            ),
            f"creating a LoRA training client on {t.base_model}",
        )

    def _build_components(self) -> None:
        super()._build_components()
        self.plan = mapping.loss_plan(
            self.fns.policy_loss, self.fns.kl_loss, self.ref_model is not None
        )
        if self.plan.loss_fn is None:
            logger.info("Tinker: forward_backward_custom, because of %s", self.plan.why)
        else:
            logger.info("Tinker: built-in loss %s %s", self.plan.loss_fn, self.plan.config)

    # ---- checkpoints ---------------------------------------------------------------------
    def _restore_policy(self, state: Dict[str, Any], step: int) -> None:
        saved = state["extra"].get(TINKER_KEY)
        source = ckpt.step_dir(self.job_dir, step)
        if saved is None:
            raise ckpt.CheckpointError(
                f"{source} was written without Tinker (its weights are local): resume with "
                "model.tinker.enable: false, or set continue_from_checkpoint: false to start over"
            )
        if saved["base_model"] != self.tinker.base_model:
            raise ckpt.CheckpointError(
                f"{source} trained an adapter on {saved['base_model']}, not "
                f"model.tinker.base_model = {self.tinker.base_model}; set that base model, or "
                "set continue_from_checkpoint: false to start over"
            )
        self.model = wait_result(
            self.service.create_training_client_from_state_with_optimizer(saved["state_path"]),
            f"loading {saved['state_path']} (checkpoint {source})",
        )
        self.lr_steps = int(state["optim"]["lr_steps"])
        logger.info("Tinker: resumed the adapter and optimizer of %s", saved["state_path"])

    def _policy_state(self) -> PolicyState:
        path = wait_result(self.model.save_state(f"step_{self.step}"), "save_state").path
        extra = {"state_path": path, "base_model": self.tinker.base_model}
        if self.step in self._samplers:
            extra["sampler_path"] = self._samplers[self.step]
        return PolicyState({}, None, {"lr_steps": self.lr_steps}, {TINKER_KEY: extra})

    def sampler_path(self, version: int) -> str:
        """The service path of the current weights for sampling, saved once per version."""
        if version not in self._samplers:
            saved = self.model.save_weights_for_sampler(f"step_{version}")
            self._samplers[version] = wait_result(saved, "save_weights_for_sampler").path
        return self._samplers[version]

    def export_hf(self, out_dir: str) -> None:
        raise ckpt.CheckpointError(
            "a Tinker run's weights stay in the service (the checkpoint's extra.json names "
            "them): no Hugging Face export; set trainer.save_hf_checkpoint: never"
        )

    # ---- scoring -------------------------------------------------------------------------
    def _score(self, model: Any, batch: ExperienceBatch) -> torch.Tensor:
        """(B, R) response logprobs: the policy's by ``forward``, the reference's by the
        base model's ``compute_logprobs``."""
        if model is self.model:
            data = mapping.datums(batch, {})
            output = wait_result(self.model.forward(data, "cross_entropy"), "forward")
            return mapping.response_columns(mapping.output_logprobs(output), batch)
        return self._reference_logprobs(model, batch)

    def _reference_logprobs(self, sampler: Any, batch: ExperienceBatch) -> torch.Tensor:
        from tinker import types

        P, R = batch.prompt_len, batch.response_len
        rows, futures = mapping.row_spans(batch), []
        for i, (p, r) in enumerate(rows):
            tokens = batch.input_ids[i, P - p : P + r].tolist()
            futures.append(sampler.compute_logprobs(types.ModelInput.from_ints(tokens), r or None))
        out = torch.zeros(len(rows), R)
        for i, (future, (p, r)) in enumerate(zip(futures, rows, strict=True)):
            scored = wait_result(future, "compute_logprobs of the base model")
            out[i, :r] = torch.tensor([float(v) for v in scored[p : p + r]])
        return out

    # ---- one update ----------------------------------------------------------------------
    def _update_actor(self, batch: ExperienceBatch) -> Dict[str, float]:
        loss = self.fns.policy_loss
        totals: Dict[str, float] = {}
        scored: Optional[torch.Tensor] = None
        lr = self.config.algorithm.optimizer.lr * self.lr_factor(self.lr_steps)
        params = mapping.adam_params(
            self.config.algorithm.optimizer, self.settings["grad_clip"], lr
        )
        seconds = {"forward_backward": 0.0, "optim_step": 0.0}
        for epoch in range(self.settings["ppo_epochs"]):
            if loss.batch_keys:  # whole-batch inputs (M2PO's mask) at this epoch's weights
                scores = self._score(self.model, batch)
                batch.extra.update(loss.batch_inputs(**loss_inputs(loss.batch_keys, batch, scores)))
            start = time.monotonic()
            totals, logprob = self._forward_backward(batch)
            seconds["forward_backward"] += time.monotonic() - start
            start = time.monotonic()
            step = wait_result(self.model.optim_step(params), "optim_step")
            seconds["optim_step"] += time.monotonic() - start
            if epoch == 0:
                scored = logprob
        metrics = {f"actor/{k}": v for k, v in totals.items()}
        metrics.update({f"time/tinker_{k}": v for k, v in seconds.items()})
        # the gradient norm the service reports for the update
        if step.metrics and "grad_norm" in step.metrics:
            metrics["actor/grad_norm"] = step.metrics["grad_norm"]
        metrics["actor/lr"] = lr
        self.lr_steps += 1
        if self.correction is None and scored is not None:  # as in-process: first pass
            metrics.update(mismatch_metrics(scored, batch.old_logprob, sampled_tokens(batch)))
        return metrics

    def _forward_backward(self, batch: ExperienceBatch) -> Tuple[Dict[str, float], torch.Tensor]:
        """One forward_backward of the whole batch: (loss metrics, (B, R) logprobs)."""
        if self.plan.loss_fn is None:
            data = mapping.datums(batch, {})
            output = wait_result(
                self.model.forward_backward_custom(data, self._custom_loss(batch)),
                "forward_backward_custom",
            )
            logprob = mapping.response_columns(mapping.output_logprobs(output), batch)
            return {k: v for k, v in output.metrics.items() if ":" not in k}, logprob
        scale = mapping.token_scale(
            batch.action_mask, self.fns.loss_agg_mode, batch.extra.get(IS_WEIGHTS_KEY)
        )
        fields = (
            {"weights": scale}
            if "weights" in self.plan.inputs
            else {
                "logprobs": batch.old_logprob,
                "advantages": batch.advantages * scale,
            }
        )
        output = wait_result(
            self.model.forward_backward(
                mapping.datums(batch, fields), self.plan.loss_fn, self.plan.config
            ),
            f"forward_backward ({self.plan.loss_fn})",
        )
        logprob = mapping.response_columns(mapping.output_logprobs(output), batch)
        # The run's own loss on the service's logprobs: its metrics, and the value the
        # built-in loss took (the same sum, so the two agree).
        _, metrics = self._loss_terms(batch, logprob)
        return metrics, logprob

    def _custom_loss(self, batch: ExperienceBatch) -> Any:
        """The callable ``forward_backward_custom`` differentiates: this project's loss of the
        whole batch, from the per-datum logprobs the service returned."""

        def loss_fn(data: List[Any], logprobs: List[torch.Tensor]) -> Tuple[torch.Tensor, Dict]:
            return self._loss_terms(batch, mapping.response_columns(logprobs, batch))

        return loss_fn

    def _loss_terms(
        self, batch: ExperienceBatch, logprob: torch.Tensor
    ) -> Tuple[torch.Tensor, Dict]:
        """Policy loss plus KL loss of the batch (the entropy term is zero with Tinker:
        checked before start), and their metrics, as ``accumulate_gradients`` adds them."""
        fns = self.fns
        loss, metrics = fns.policy_loss(**loss_inputs(fns.policy_loss.select_keys, batch, logprob))
        if batch.ref_logprob is not None:
            kl_loss, kl_metrics = fns.kl_loss.calculate_kl_loss(
                logprob, batch.ref_logprob, batch.action_mask, fns.loss_agg_mode
            )
            loss = loss + kl_loss
            metrics.update(kl_metrics)
        return loss, {k: float(v) for k, v in metrics.items()}
