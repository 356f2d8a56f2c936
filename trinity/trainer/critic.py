"""The PPO critic: a causal-LM backbone with a scalar value head and its own optimizer.

Value of response column ``j`` is read at the position that predicts token ``P + j``
(position ``P + j - 1``), i.e. the value of the state before the token is generated,
matching where the policy's logprobs are read (``policy_step.response_logprobs``).
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn

from trinity.algorithm.optimizer import build_lr_scheduler, build_optimizer
from trinity.algorithm.value_loss import clipped_value_loss
from trinity.common.experience import ExperienceBatch
from trinity.ops.packed_linear import route_linears
from trinity.trainer.policy_step import micro_batches
from trinity.utils.device import DTYPES, compute_in


class ValueModel(nn.Module):
    """``AutoModel`` backbone + ``Linear(hidden, 1)`` head, initialised to predict 0."""

    def __init__(self, model_path: str) -> None:
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(model_path, dtype=torch.float32)
        self.value_head = nn.Linear(self.backbone.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: ExperienceBatch) -> torch.Tensor:
        """(B, R) values of the states before each response token."""
        P, R = batch.prompt_len, batch.response_len
        hidden = self.backbone(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state
        return self.value_head(hidden[:, P - 1 : P + R - 1]).squeeze(-1).float()


class Critic:
    """Owns the value model's training: ``values`` before the advantage, ``update`` after."""

    def __init__(
        self,
        settings: Dict[str, Any],
        planned_steps: int,
        loss_agg_mode: str,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        self.settings = settings
        self.model = ValueModel(settings["model_path"]).to(device)
        route_linears(self.model)  # fp32 on CPU: oneDNN's matmuls
        if settings.get("enable_gradient_checkpointing"):
            self.model.backbone.gradient_checkpointing_enable()
        compute_in(self.model, DTYPES[settings["param_dtype"]])
        self.device = device
        self.optimizer = build_optimizer(self.model.parameters(), settings["optimizer"])
        self.scheduler = build_lr_scheduler(self.optimizer, settings["optimizer"], planned_steps)
        self.loss_agg_mode = loss_agg_mode

    def _max_tokens(self, key: str) -> Any:
        return self.settings[key] if self.settings["use_dynamic_bsz"] else None

    @torch.no_grad()
    def values(self, batch: ExperienceBatch) -> torch.Tensor:
        self.model.eval()
        parts = [
            self.model(mb.to(self.device))
            for mb in micro_batches(
                batch,
                self.settings["forward_micro_batch_size_per_device"],
                self._max_tokens("forward_max_token_len_per_device"),
            )
        ]
        return torch.cat(parts, dim=0).float().cpu() * batch.action_mask

    def update(self, batch: ExperienceBatch) -> Dict[str, float]:
        """Regress the values on ``batch.returns`` (clipped around the values used for GAE)."""
        self.model.train()
        totals: Dict[str, float] = {}
        for _ in range(self.settings["ppo_epochs"]):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in micro_batches(
                batch,
                self.settings["micro_batch_size_per_device"],
                self._max_tokens("max_token_len_per_device"),
            ):
                share = len(mb) / len(batch)
                mb = mb.to(self.device)
                loss, metrics = clipped_value_loss(
                    self.model(mb),
                    mb.extra["values"],
                    mb.returns,
                    mb.action_mask,
                    self.settings["cliprange_value"],
                    self.loss_agg_mode,
                )
                (loss * share).backward()
                for k, v in metrics.items():
                    totals[f"critic/{k}"] = totals.get(f"critic/{k}", 0.0) + float(v) * share
            grad_norm = nn.utils.clip_grad_norm_(
                self.model.parameters(), self.settings["grad_clip"]
            )
            self.optimizer.step()
        totals["critic/grad_norm"] = float(grad_norm)
        totals["critic/lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return totals

    def state_dict(self) -> Dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
