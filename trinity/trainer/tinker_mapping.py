"""How a training step of this project becomes Tinker API calls: pure functions, no service.

- ``loss_plan``: the run's loss as one of the API's built-in losses where one computes the
  same gradient (``ppo``, ``cispo``, ``cross_entropy``), else ``None``: the trainer then calls
  ``forward_backward_custom`` with this project's own loss on the logprobs the service returns.
- ``token_scale``: the API's losses are sums over tokens, this project's are aggregated
  (``loss_agg_mode``). Each built-in loss is a sum of per-token terms positively homogeneous
  in the token's advantage (or weight): ``c * min(r A, clip(r) A) = min(r cA, clip(r) cA)`` for
  ``c >= 0``. So scaling each token's advantage by its share in the aggregation (and by the
  rollout-correction importance weight, also ``>= 0``) makes the sum equal the aggregated loss.
- ``datums``: one ``tinker.types.Datum`` per row: ``model_input`` the sequence less its last
  token, ``target_tokens`` the sequence less its first; response column ``j`` of a row whose
  prompt has ``p`` tokens is target position ``p - 1 + j``. ``(B, R)`` tensors become
  per-datum vectors with zeros on prompt positions (no advantage, no weight: no gradient).
- ``response_columns``: the reverse, for the per-datum logprobs the service returns.
- ``adam_params``: ``algorithm.optimizer`` and ``trainer.grad_clip`` at one step's lr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from trinity.algorithm.entropy_loss_fn.default import DefaultEntropyLossFn, NoEntropyLossFn
from trinity.algorithm.optimizer import ADAM_EPS
from trinity.algorithm.policy_loss_fn.cispo import CISPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.ppo import PPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.sft import SFTLossFn
from trinity.common.experience import ExperienceBatch


@dataclass(frozen=True)
class LossPlan:
    """``loss_fn``: the built-in loss to send (None: ``forward_backward_custom``), with its
    ``loss_fn_config``; ``inputs``: the ``loss_fn_inputs`` besides ``target_tokens``;
    ``why``: what made a run custom (for the log)."""

    loss_fn: Optional[str]
    config: Dict[str, float] = field(default_factory=dict)
    inputs: tuple = ()
    why: str = ""


def entropy_term_is_zero(entropy_loss: Any) -> bool:
    """Whether the entropy component adds nothing to the loss (the API returns no entropy)."""
    if type(entropy_loss) is NoEntropyLossFn:
        return True
    return type(entropy_loss) is DefaultEntropyLossFn and entropy_loss.entropy_coef == 0.0


def loss_plan(policy_loss: Any, kl_loss: Any, has_reference: bool) -> LossPlan:
    """The API call that trains this loss: a built-in one only where it is exactly this
    project's loss (the exact class: a subclass may compute something else)."""
    kl_coef = getattr(kl_loss, "kl_coef", 0.0)
    if has_reference and type(kl_loss).__name__ != "NoKLFn" and kl_coef != 0.0:
        return LossPlan(None, why=f"the KL loss ({type(kl_loss).__name__}, kl_coef {kl_coef})")
    kind = type(policy_loss)
    if kind is PPOPolicyLossFn and policy_loss.clip_ratio_c is None:
        bounds = {
            "clip_low_threshold": 1.0 - policy_loss.clip_range_low,
            "clip_high_threshold": 1.0 + policy_loss.clip_range_high,
        }
        return LossPlan("ppo", bounds, ("logprobs", "advantages"))
    if kind is CISPOPolicyLossFn:
        low = policy_loss.clip_range_low
        # No lower bound: ratios are never negative, so a bound of 0 is none.
        bounds = {
            "clip_low_threshold": 0.0 if low is None else 1.0 - low,
            "clip_high_threshold": 1.0 + policy_loss.clip_range_high,
        }
        return LossPlan("cispo", bounds, ("logprobs", "advantages"))
    if kind is SFTLossFn:
        return LossPlan("cross_entropy", {}, ("weights",))
    return LossPlan(None, why=f"the policy loss {kind.__name__}, which no built-in loss equals")


def token_scale(
    mask: torch.Tensor, mode: str, weights: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """(B, R) factor of each token's term so that the sum over tokens is the ``mode``
    aggregate (``trinity.algorithm.utils.aggregate_loss``) of the whole batch; ``weights``
    (detached importance weights) multiply it, as they multiply the per-token losses."""
    mask = mask.float()
    rows, columns = mask.shape
    if mode == "token-mean":
        scale = mask / mask.sum().clamp(min=1.0)
    elif mode == "seq-mean-token-sum":
        scale = mask / rows
    elif mode == "seq-mean-token-mean":
        scale = mask / (rows * mask.sum(-1, keepdim=True).clamp(min=1e-8))
    elif mode == "seq-mean-token-sum-norm":
        scale = mask / (rows * float(columns))
    else:
        raise ValueError(f"unknown loss_agg_mode '{mode}'")
    return scale if weights is None else scale * weights


def row_spans(batch: ExperienceBatch) -> List[tuple]:
    """(prompt tokens, response tokens) of each row, from the padded layout."""
    P = batch.prompt_len
    prompt = batch.attention_mask[:, :P].sum(-1).tolist()
    response = batch.attention_mask[:, P:].sum(-1).tolist()
    spans = list(zip(prompt, response, strict=True))
    if any(p < 1 for p, _ in spans):
        raise ValueError(
            "a row has no prompt token: the API predicts each token from the ones before"
        )
    return spans


def datums(batch: ExperienceBatch, fields: Dict[str, torch.Tensor]) -> List[Any]:
    """One ``tinker.types.Datum`` per row with ``target_tokens`` and the (B, R) ``fields``
    placed at the response's target positions."""
    from tinker import types

    P, out = batch.prompt_len, []
    for i, (p, r) in enumerate(row_spans(batch)):
        tokens = batch.input_ids[i, P - p : P + r].tolist()
        inputs: Dict[str, Any] = {"target_tokens": torch.tensor(tokens[1:], dtype=torch.int64)}
        for name, values in fields.items():
            vector = torch.zeros(len(tokens) - 1, dtype=torch.float32)
            vector[p - 1 : p - 1 + r] = values[i, :r].detach().float().cpu()
            inputs[name] = vector
        out.append(
            types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
        )
    return out


def response_columns(per_datum: List[torch.Tensor], batch: ExperienceBatch) -> torch.Tensor:
    """(B, R) response logprobs from per-datum target logprobs (gradients flow through);
    zeros past each row's response."""
    R, rows = batch.response_len, []
    for vector, (p, r) in zip(per_datum, row_spans(batch), strict=True):
        part = vector.reshape(-1)[p - 1 : p - 1 + r]
        rows.append(torch.nn.functional.pad(part, (0, R - r)))
    return torch.stack(rows)


def output_logprobs(output: Any) -> List[torch.Tensor]:
    """The per-datum ``logprobs`` of a ``ForwardBackwardOutput``."""
    return [torch.as_tensor(o["logprobs"].to_numpy()).float() for o in output.loss_fn_outputs]


def adam_params(optimizer: Any, grad_clip: float, lr: float) -> Any:
    """``tinker.types.AdamParams`` of one step: ``algorithm.optimizer``'s betas and weight
    decay, the in-process trainer's eps, ``trainer.grad_clip`` as the norm clip."""
    from tinker import types

    beta1, beta2 = optimizer.betas
    return types.AdamParams(
        learning_rate=lr,
        beta1=beta1,
        beta2=beta2,
        eps=ADAM_EPS,
        weight_decay=optimizer.weight_decay,
        grad_clip_norm=grad_clip,
    )
