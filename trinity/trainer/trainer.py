"""Trainer: reads experiences through the sample strategy, updates the policy, saves, syncs."""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM_TYPE,
    ENTROPY_LOSS_FN,
    KL_FN,
    SAMPLE_STRATEGY,
)
from trinity.algorithm.advantage_fn.base import POLICY_ENTROPY_KEY, POLICY_LOGPROB_KEY
from trinity.algorithm.algorithm import PairExperienceModel, needs_reference
from trinity.algorithm.kl_fn import build_kl_controller
from trinity.algorithm.optimizer import build_lr_scheduler, build_optimizer
from trinity.algorithm.policy_loss_fn import build_policy_loss
from trinity.algorithm.rollout_correction import mismatch_metrics
from trinity.common.config import effective_trainer_settings
from trinity.common.config.config import rollout_temperature
from trinity.common.experience import Experience, ExperienceBatch
from trinity.common.weights import weights_path
from trinity.ops.packed_linear import route_linears
from trinity.trainer import checkpoint as ckpt
from trinity.trainer import lora
from trinity.trainer.actor_batch import ROLLOUT_LOGPROBS, actor_batch, sampled_tokens
from trinity.trainer.critic import Critic
from trinity.trainer.distributed import as_number
from trinity.trainer.policy_step import (
    LossFns,
    accumulate_gradients,
    loss_inputs,
    response_scores,
)
from trinity.trainer.step_metrics import batch_metrics, perf_metrics
from trinity.utils.device import DTYPES, attention_kwargs, compute_in, role_device
from trinity.utils.openmp import release_workers

logger = logging.getLogger(__name__)

UNLOGGED_KEY = "unlogged_metrics"  # in a checkpoint's extra.json: its step's metrics


class PolicyState(NamedTuple):
    """What a checkpoint saves of the policy."""

    weights: Any  # the module, or LoRA tensors; empty when the weights live elsewhere
    metadata: Optional[Dict[str, str]]  # the safetensors header's (LoRA: the layout)
    optimizer: Dict[str, Any]  # optimizer.pt
    extra: Dict[str, Any]  # into extra.json


class Trainer:
    def __init__(
        self,
        config: Any,
        planned_steps: int,
        log: Callable[[Dict[str, float], int], None],
        publish: Optional[Callable[[int, torch.nn.Module], None]] = None,
        report: Optional[Callable[[str], None]] = None,
        publish_due: Optional[Callable[[int], bool]] = None,
    ) -> None:
        """``publish(version, model)`` hands weights to the explorer after the steps where
        ``publish_due(step)`` (default: every ``synchronizer.sync_interval`` steps) and at
        the end; ``planned_steps`` sizes the lr schedule and bounds the loop; ``report`` says
        noteworthy things on the console. Call ``prepare_model`` then ``attach_reader``."""
        self.config = config
        self.planned_steps = planned_steps
        self.log = log
        self.publish = publish
        interval = config.synchronizer.sync_interval
        self.publish_due = publish_due or (lambda step: step % interval == 0)
        self.report = report or (lambda text: None)
        self.job_dir = config.checkpoint_job_dir
        self.step = 0
        # this step's metrics from its publish until they are logged (see ``run``)
        self.unlogged: Optional[Dict[str, float]] = None

    # ---- setup ---------------------------------------------------------------------------
    def prepare_model(self) -> int:
        """Load model, optimizer, algorithm; resume from the last checkpoint if asked."""
        cfg, algo = self.config, self.config.algorithm
        self.settings = effective_trainer_settings(cfg)
        self.algorithm = ALGORITHM_TYPE.get(algo.algorithm_type)
        self._load_models()
        self._build_components()
        self._sampler_state: Dict[str, Any] = {}
        if cfg.continue_from_checkpoint and ckpt.latest_step(self.job_dir) is not None:
            self._resume(ckpt.latest_step(self.job_dir))
        return self.step

    def _load_models(self) -> None:
        """Policy (LoRA: adapter on the base), reference, teacher, optimizer, lr schedule."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg, algo = self.config, self.config.algorithm
        path = cfg.model.model_path
        self.device = role_device(cfg.cluster.gpu_per_node > 0)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, **attention_kwargs(self.device)
        )
        self.lora = cfg.model.lora_configs[0] if cfg.model.lora_configs else None
        if self.lora is not None:
            self.model = lora.wrap(self.model, self.lora, self.lora.base_model_name or path)
        self.model.to(self.device)
        route_linears(self.model)  # fp32 on CPU: oneDNN's matmuls (trinity/ops/packed_linear.py)
        if self.settings["enable_gradient_checkpointing"]:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.ref_model = None
        # With LoRA the reference is the policy with its adapter off: the base, no copy.
        self.ref_is_base = False
        if needs_reference(
            self.algorithm, algo.kl_loss_fn, algo.kl_penalty_fn, algo.policy_loss_fn
        ):
            self.ref_is_base = self.lora is not None
            self.ref_model = None if self.ref_is_base else self._frozen(path)
        self.teacher = None
        if self.algorithm.use_teacher:
            self.teacher = self._frozen(cfg.explorer.auxiliary_models[0].model_path)
        self.model = compute_in(self._distribute(self.model), DTYPES[self.settings["param_dtype"]])
        self.optimizer = build_optimizer(lora.trainable_parameters(self.model), algo.optimizer)
        self.scheduler = build_lr_scheduler(self.optimizer, algo.optimizer, self.planned_steps)

    def _build_components(self) -> None:
        """The algorithm's components: losses, rollout correction, KL, advantage, critic."""
        cfg, algo = self.config, self.config.algorithm
        self.fns = LossFns(
            policy_loss=build_policy_loss(algo.policy_loss_fn, algo.policy_loss_fn_args),
            kl_loss=KL_FN.get(algo.kl_loss_fn)(**algo.kl_loss_fn_args),
            entropy_loss=ENTROPY_LOSS_FN.get(algo.entropy_loss_fn)(**algo.entropy_loss_fn_args),
            temperature=rollout_temperature(cfg) if self.algorithm.use_advantage else 1.0,
        )
        self.fns.loss_agg_mode = self.fns.policy_loss.loss_agg_mode
        self.correction = algo.rollout_correction if algo.rollout_correction.enabled else None
        self.fns.row_multiple = 2 if self.algorithm.schema is PairExperienceModel else 1
        # veRL's kl_ctrl (fixed | adaptive) steers the in-reward KL coefficient over training.
        penalty_args = dict(algo.kl_penalty_fn_args)
        kl_ctrl = penalty_args.pop("kl_ctrl", None)
        self.kl_penalty = KL_FN.get(algo.kl_penalty_fn)(**penalty_args)
        self.kl_ctrl = build_kl_controller(kl_ctrl, penalty_args.get("kl_coef", 0.001))
        self.advantage_fn = (
            ADVANTAGE_FN.get(algo.advantage_fn)(**algo.advantage_fn_args)
            if self.algorithm.use_advantage
            else None
        )
        self.critic = None
        if self.algorithm.use_critic:
            self.critic = Critic(
                self.settings["critic"], self.planned_steps, self.fns.loss_agg_mode, self.device
            )

    def _frozen(self, path: str) -> torch.nn.Module:
        """A model that only scores (reference or teacher); it must share the vocabulary."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, **attention_kwargs(self.device)
        ).eval()
        if model.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(
                f"{path} has vocab_size {model.config.vocab_size}, the policy "
                f"{self.model.config.vocab_size}: logprobs are only comparable on one vocabulary"
            )
        model = model.to(self.device).requires_grad_(False)
        route_linears(model)
        model = self._distribute(model)
        return compute_in(model, DTYPES[self.settings["ref_param_dtype"]])

    def _distribute(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as this process trains it: whole here; sharded over several ranks
        (``sharded.ShardedTrainer``)."""
        return model

    def attach_reader(
        self, reader: Any, auxiliary_readers: Optional[Dict[str, Any]] = None
    ) -> None:
        """Connect the experience source (SFT data needs the tokenizer, so after the model).

        ``auxiliary_readers`` (``buffer.trainer_input.auxiliary_buffers`` by name) go to the
        sample strategy, which decides how to mix them in.
        """
        algo = self.config.algorithm
        self.reader = reader
        # What a strategy may need from the run; the user's sample_strategy_args win.
        context = {
            "auxiliary_readers": auxiliary_readers or {},
            "group_size": algo.repeat_times,
            "max_response_tokens": self.config.model.max_response_tokens,
        }
        self.sampler = SAMPLE_STRATEGY.get(algo.sample_strategy)(
            reader, **{**context, **algo.sample_strategy_args}
        )
        self.sampler.load_state_dict(self._sampler_state)

    def _resume(self, step: int) -> None:
        state = ckpt.load_checkpoint(self.job_dir, step)
        self._restore_policy(state, step)
        self._sampler_state = state["extra"].get("sample_strategy", {})
        self.kl_ctrl.load_state_dict(state["extra"].get("kl_ctrl", self.kl_ctrl.state_dict()))
        self.unlogged = state["extra"].get(UNLOGGED_KEY)
        if self.critic is not None:
            if "critic" not in state["states"]:
                raise ckpt.CheckpointError(
                    f"{ckpt.step_dir(self.job_dir, step)} has no critic.pt, but this algorithm "
                    "trains a critic: resume with the algorithm that wrote it or start over"
                )
            self.critic.load_state_dict(state["states"]["critic"])
        self.step = step
        logger.info("resumed the trainer from %s", ckpt.step_dir(self.job_dir, step))

    def _restore_policy(self, state: Dict[str, Any], step: int) -> None:
        """The checkpoint's weights and optimizer state back where they train."""
        self._load_weights(state["model"], step)
        self.optimizer.load_state_dict(state["optim"]["optimizer"])
        self.scheduler.load_state_dict(state["optim"]["scheduler"])

    def _load_weights(self, weights: Dict[str, torch.Tensor], step: int) -> None:
        """Checkpointed weights back onto the model (with LoRA: the adapter onto the base)."""
        source = weights_path(self.job_dir, step)
        if not weights:  # a Tinker run's: its weights stay in the service
            raise ckpt.CheckpointError(
                f"{source} holds no weights (model.tinker.enable wrote it): resume with Tinker, "
                "or set continue_from_checkpoint: false to start over"
            )
        if self.lora is not None:
            try:
                lora.load_adapter_state(self.model, weights, source)
            except ValueError as exc:
                raise ckpt.CheckpointError(str(exc)) from exc
        elif any(".lora_A." in name for name in weights):
            raise ckpt.CheckpointError(
                f"{source} holds a LoRA adapter, not a whole model: set model.lora_configs as "
                "in the run that wrote it, or set continue_from_checkpoint: false to start over"
            )
        else:
            self.model.load_state_dict(weights)

    # ---- one step --------------------------------------------------------------------------
    @property
    def needs_groups(self) -> bool:
        """Whether batches must hold whole groups (the advantage compares a task's rollouts)."""
        return self.advantage_fn is not None and getattr(self.advantage_fn, "needs_groups", False)

    def _tokens(self, key: str, dynamic_key: str) -> Optional[int]:
        return self.settings[key] if self.settings[dynamic_key] else None

    def _batch(self, experiences: List[Experience]) -> ExperienceBatch:
        """Pad experiences and lift per-row flags that components read by name; ``step``
        (every row: the step being trained) is for losses on a schedule (``mix_chord``)."""
        batch = ExperienceBatch.from_experiences(experiences, self.tokenizer.pad_token_id)
        batch.extra["step"] = torch.full((len(experiences),), float(self.step))
        for flag, name, default in (
            ("is_expert", "expert_mask", 0.0),
            ("sample_weight", "sample_weight", 1.0),
        ):
            if any(flag in e.info for e in experiences):
                values = [float(e.info.get(flag, default)) for e in experiences]
                batch.extra[name] = torch.tensor(values)
        return batch

    def _score(self, model: torch.nn.Module, batch: ExperienceBatch) -> torch.Tensor:
        """(B, R) logprobs of the batch's responses under a frozen model (veRL's ``ref`` sizes)."""
        return self._score_tokens(model, batch, with_entropy=False)[0]

    def _score_tokens(
        self, model: torch.nn.Module, batch: ExperienceBatch, with_entropy: bool
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``_score``'s logprobs, and with ``with_entropy`` each token's (B, R) entropy."""
        return response_scores(
            model,
            batch,
            self.settings["ref_micro_batch_size_per_device"],
            self.fns.temperature,
            self._tokens("ref_max_token_len_per_device", "ref_use_dynamic_bsz"),
            with_entropy=with_entropy,
        )

    def _prepare_batch(self, batch: ExperienceBatch) -> Tuple[ExperienceBatch, Dict[str, float]]:
        """Reference logprobs, values, KL-in-reward, the policy's scores (an advantage fn's
        ``needs_policy_scores``) and advantages, in that order; the batch the advantage fn
        returns (it may leave rows out: GRPO's std_threshold)."""
        metrics: Dict[str, float] = {}
        if self.ref_model is not None:
            batch.ref_logprob = self._score(self.ref_model, batch)
        elif self.ref_is_base:
            with lora.adapter_disabled(self.model) as base:
                batch.ref_logprob = self._score(base, batch)
        if self.teacher is not None:
            batch.extra["teacher_logprob"] = self._score(self.teacher, batch)
        if self.critic is not None:
            batch.extra["values"] = self.critic.values(batch)
        if self.advantage_fn is not None:
            self.kl_penalty.kl_coef = self.kl_ctrl.value
            batch, kl_metrics = self.kl_penalty.apply_kl_penalty_to_reward(batch)
            if "actor/reward_kl_penalty" in kl_metrics:
                self.kl_ctrl.update(kl_metrics["actor/reward_kl_penalty"], n_steps=len(batch))
            if getattr(self.advantage_fn, "needs_policy_scores", False):  # pre-update, no grad
                scores = self._score_tokens(self.model, batch, with_entropy=True)
                batch.extra[POLICY_LOGPROB_KEY], batch.extra[POLICY_ENTROPY_KEY] = scores
            batch, adv_metrics = self.advantage_fn(batch)
            metrics.update({**kl_metrics, **adv_metrics})
            if "sample_weight" in batch.extra:  # e.g. staleness_control down-weighting
                batch.advantages = batch.advantages * batch.extra["sample_weight"].unsqueeze(-1)
        return batch, metrics

    def _rescore(self, batch: ExperienceBatch) -> None:
        """Rollout correction's old logprobs: the batch scored by the policy before this
        step's update (veRL's decoupled mode); the engine's move to ``ROLLOUT_LOGPROBS``."""
        batch.extra[ROLLOUT_LOGPROBS] = batch.old_logprob
        batch.old_logprob = self._score(self.model, batch)

    def _update_actor(self, batch: ExperienceBatch) -> Dict[str, float]:
        max_tokens = self._tokens("max_token_len_per_device", "use_dynamic_bsz")
        # Without rollout correction the mismatch metrics take the trainer's side from the
        # first pass, which scores with the weights the explorer sampled from (before any
        # update): no extra forward pass.
        scored: Optional[List[torch.Tensor]] = [] if self.correction is None else None
        loss = self.fns.policy_loss
        for epoch in range(self.settings["ppo_epochs"]):
            self.optimizer.zero_grad(set_to_none=True)
            if loss.batch_keys:  # whole-batch inputs (M2PO's mask) at this epoch's weights
                scores = self._score(self.model, batch)
                batch.extra.update(loss.batch_inputs(**loss_inputs(loss.batch_keys, batch, scores)))
            totals = self._accumulate(batch, max_tokens, scored if epoch == 0 else None)
            grad_norm = as_number(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings["grad_clip"])
            )
            if math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                logger.warning("step %d: non-finite grad norm, update skipped", self.step)
        metrics = {f"actor/{k}": v for k, v in totals.items()}
        metrics["actor/grad_norm"] = grad_norm
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        if scored:
            trainer_logprob = torch.cat(scored)
            metrics.update(
                mismatch_metrics(trainer_logprob, batch.old_logprob, sampled_tokens(batch))
            )
        return metrics

    def _accumulate(
        self,
        batch: ExperienceBatch,
        max_tokens: Optional[int],
        scored: Optional[List[torch.Tensor]] = None,
    ) -> Dict[str, float]:
        """Gradients of the batch's loss; the loss terms' values (batch means). ``scored``
        (a list) receives the batch's (B, R) logprobs of this pass."""
        micro_batch_size = self.settings["micro_batch_size_per_device"]
        return accumulate_gradients(
            self.model, batch, self.fns, micro_batch_size, max_tokens, keep=scored
        )

    def train_step(self, experiences: List[Experience]) -> Dict[str, float]:
        """One update from one batch; ``self.step`` is the (1-based) step being trained."""
        start = time.monotonic()
        batch = self._batch(experiences)
        if self.correction is not None:
            self._rescore(batch)
        batch, metrics = self._prepare_batch(batch)
        if self.critic is not None:
            metrics.update(self.critic.update(batch))
        # veRL's critic_warmup: the first steps train only the critic.
        if self.critic is None or self.step > self.settings["critic_warmup"]:
            # rollout correction's and the advantage fn's token masks: the actor's alone
            trained, correction_metrics = actor_batch(batch, self.correction)
            metrics.update(correction_metrics)
            metrics.update(self._update_actor(trained))
        metrics.update(batch_metrics(batch, self.config.model.max_response_tokens))
        metrics["time/train_step"] = time.monotonic() - start
        metrics.update(perf_metrics(batch, metrics["time/train_step"], self.device))
        return metrics

    # ---- loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Train until the buffer runs out or ``planned_steps`` is done; returns the last step."""
        cfg = self.config
        while self.step < self.planned_steps:
            start = time.monotonic()
            try:
                experiences, sample_metrics = self._sample()
            except StopIteration:
                break
            self.step += 1
            metrics = {**sample_metrics, "time/read_experiences": time.monotonic() - start}
            if experiences:
                metrics.update(self.train_step(experiences))
            else:  # e.g. every task of its explore step failed: keep the step count in sync
                self.report(f"train step {self.step}: no experience to train on; weights unchanged")
            if self.publish is not None and self.publish_due(self.step):
                # Publish before logging: the explorer may be waiting. A publish by checkpoint
                # saves this step before its metrics are logged, so the checkpoint carries
                # them (``unlogged``): a run killed in between logs them when it resumes.
                self.unlogged = metrics
                start = time.monotonic()
                self.publish(self.step, self.model)
                metrics["time/sync_weights"] = time.monotonic() - start
            self.log(metrics, self.step)
            self.unlogged = None
            release_workers()  # the explorer's turn: see utils/openmp.py
            if cfg.trainer.save_interval and self.step % cfg.trainer.save_interval == 0:
                self.save(final=False)
        self.save(final=True)
        if self.publish is not None:
            self.publish(self.step, self.model)
        return self.step

    def _sample(self) -> Tuple[List[Experience], Dict[str, float]]:
        """The next step's experiences and sampling metrics; StopIteration when the buffer
        is exhausted."""
        if hasattr(self.reader, "begin_step"):  # an accounted buffer reads by step
            self.reader.begin_step(self.step + 1)
        try:
            exps, metrics = self.sampler.sample(self.step + 1, self.config.buffer.train_batch_size)
        except StopIteration:  # what max_staleness dropped at the end: on the last step's row
            dropped = getattr(self.reader, "step_metrics", dict)().get("staleness/dropped")
            if dropped:
                self.log({"staleness/dropped": dropped}, self.step)
            raise
        if hasattr(self.reader, "step_metrics"):  # synchronizer.max_staleness's figures
            metrics.update(self.reader.step_metrics())
        return exps, metrics

    def _unlogged_extra(self) -> Dict[str, Any]:
        """For a checkpoint's ``extra``: this step's metrics if they are not logged yet."""
        return {UNLOGGED_KEY: self.unlogged} if self.unlogged is not None else {}

    def save(self, final: bool) -> None:
        """Save the current step (once); HF export per ``trainer.save_hf_checkpoint``."""
        if self.step == 0:
            return
        if ckpt.latest_step(self.job_dir) != self.step:
            policy = self._policy_state()
            ckpt.save_checkpoint(
                self.job_dir,
                self.step,
                policy.weights,
                policy.optimizer,
                {
                    "sample_strategy": self.sampler.state_dict(),
                    "kl_ctrl": self.kl_ctrl.state_dict(),
                    **policy.extra,
                    **self._unlogged_extra(),
                },
                max_to_keep=self.config.trainer.max_checkpoints_to_keep,
                states={"critic": self.critic.state_dict()} if self.critic is not None else None,
                weights_metadata=policy.metadata,
            )
        mode = self.config.trainer.save_hf_checkpoint
        hf_dir = os.path.join(ckpt.step_dir(self.job_dir, self.step), "hf")
        if (mode == "always" or (final and mode == "last")) and not os.path.isdir(hf_dir):
            self.export_hf(hf_dir)

    def _policy_state(self) -> PolicyState:
        """A checkpoint's policy. LoRA: the adapter, and the layout an engine merges it by
        (checkpoint sync)."""
        weights, metadata = self.model, None
        if self.lora is not None:
            weights, metadata = lora.checkpoint_weights(self.model)
        optim = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        return PolicyState(weights, metadata, optim, {})

    def export_hf(self, out_dir: str) -> None:
        """Write a folder ``AutoModelForCausalLM.from_pretrained`` loads (with LoRA: the
        adapter ``PeftModel.from_pretrained`` loads onto the base), whole or not at all.

        A disk error raises ``CheckpointError`` naming it, with the partial folder removed.
        """
        kept = f"the checkpoint of step {self.step} itself is intact"
        ckpt.write_whole(out_dir, self._write_hf, "the Hugging Face export", kept)

    def _write_hf(self, out_dir: str) -> None:
        """The model and tokenizer; with LoRA the adapter in peft's format, plus a whole
        merged model in ``merged/`` when ``model.lora_configs[0].save_merged`` asks."""
        if self.lora is None:
            self.model.save_pretrained(out_dir)
        else:
            lora.export_adapter(self.model, out_dir)
            if self.lora.save_merged:
                merged = os.path.join(out_dir, lora.MERGED_DIR)
                lora.export_merged(self.model, self.config.model.model_path, merged)
                self.tokenizer.save_pretrained(merged)
        self.tokenizer.save_pretrained(out_dir)
