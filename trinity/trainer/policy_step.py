"""One optimisation step of the policy: logprobs, algorithm losses, backward over micro-batches."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from trinity.algorithm.rollout_correction import IS_WEIGHTS_KEY
from trinity.common.experience import ExperienceBatch
from trinity.trainer.shared_prefix import shared_prefix_logits
from trinity.trainer.token_scores import head_scores, token_scores
from trinity.utils.device import compute_context, compute_dtype

__all__ = [
    "LossFns",
    "accumulate_gradients",
    "micro_batches",
    "output_head",
    "response_logprobs",
    "response_scores",
    "token_scores",  # re-exported: it lived here (token_scores.py)
]


def response_logprobs(
    model: torch.nn.Module,
    batch: ExperienceBatch,
    temperature: float = 1.0,
    with_entropy: bool = True,
    share_prefix: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Logprobs (B, R) of the response tokens under ``model``, and their entropy (B, R).

    Logits at column ``t`` predict token ``t + 1``, so response column ``j`` (token at
    ``P + j``) is scored by the logits at ``P + j - 1``. Dividing by the rollout temperature
    makes these comparable with the engine's logprobs. Where the logits are the output head
    applied to the decoder's hidden states (``output_head``), the head is applied a chunk of
    tokens at a time (``token_scores.head_scores``): the batch's full logits never exist.
    Rows that repeat a prompt share one pass over it (``shared_prefix.py``) unless
    ``share_prefix`` is off: sharded ranks need exactly one model call per micro-batch.
    """
    batch = batch.to(model_device(model))
    P, R = batch.prompt_len, batch.response_len
    targets = batch.input_ids[:, P : P + R]
    # On a GPU the shared-prefix pass's many small kernels cost more than the prompt
    # recomputation they save: an H100 ran the plain pass 2x faster (docs/performance.md).
    share_prefix = share_prefix and batch.input_ids.device.type == "cpu"
    parts = output_head(model)
    if parts is None:
        logits = shared_prefix_logits(model, batch) if share_prefix else None
        if logits is None:
            logits = model(**_model_inputs(batch)).logits[:, P - 1 : P + R - 1]
        return token_scores(logits, targets, temperature, with_entropy)
    decoder, head = parts
    # The decoder and head are called past the model's own forward, so under the autocast
    # it sets, and with its cached compute-dtype weights swapped in: the head's weight is
    # read inside, so the head's product uses that copy too (no cast per micro-batch).
    dtype = compute_dtype(model)
    with compute_context(model):
        hidden = shared_prefix_logits(model, batch, decoder) if share_prefix else None
        if hidden is None:
            hidden = decoder(**_model_inputs(batch)).last_hidden_state[:, P - 1 : P + R - 1]
        # Padding columns of ragged responses cost the head nothing: scores 0 there.
        real = batch.attention_mask[:, P : P + R] > 0
        return head_scores(
            hidden, head.weight, head.bias, targets, temperature, with_entropy, dtype, scored=real
        )


def _model_inputs(batch: ExperienceBatch) -> Dict[str, Any]:
    return {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
        "use_cache": False,
    }


# Architectures whose causal-LM forward is exactly ``lm_head(model(...).last_hidden_state)``
# (read in their transformers modeling files; tests/unit/test_chunked_scores.py checks each
# against its full logits). Any other keeps the full-logits path rather than risk scores
# that silently differ from the model's (Gemma 2 soft-caps, Cohere and Granite scale, ...).
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})

# Config keys that would make the logits something other than ``lm_head(hidden)``.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def output_head(model: torch.nn.Module) -> Optional[Tuple[torch.nn.Module, torch.nn.Linear]]:
    """(decoder, output head) of ``model`` when its logits are ``head(decoder(...)
    .last_hidden_state)`` with a plain ``nn.Linear`` head; None where they are not, or not
    shown to be."""
    # FSDP2 gathers the root's own parameters (embedding, head) in hooks on the root's
    # forward, which calling the decoder directly would skip: sharded models keep the logits.
    if "torch.distributed.fsdp" in sys.modules:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return None
    # A peft (LoRA) model injects its adapters into the base model's own modules, so the
    # base model's decoder and head are what the wrapper's forward runs.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODELS:
        return None
    if any(getattr(config, key, None) not in (None, 1, 1.0) for key in _LOGIT_TRANSFORMS):
        return None
    head, decoder = base.get_output_embeddings(), base.get_decoder()
    # A LoRA adapter or peft's modules_to_save on the head replaces the Linear by a wrapper
    # with its own forward: scored through the model's forward instead.
    if type(head) is not torch.nn.Linear or decoder is base:
        return None
    return decoder, head


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` computes (its first parameter's device)."""
    return next(model.parameters()).device


@dataclass
class LossFns:
    """The algorithm's components, built once per run from the config."""

    policy_loss: Any  # PolicyLossFn
    kl_loss: Any  # KLFn
    entropy_loss: Any  # EntropyLossFn
    loss_agg_mode: str = "token-mean"
    temperature: float = 1.0
    row_multiple: int = 1  # micro-batches keep groups of this many rows together


def micro_batches(
    batch: ExperienceBatch, size: int, max_tokens: Optional[int] = None, multiple: int = 1
) -> List[ExperienceBatch]:
    """Split rows into micro-batches of ``size`` rows, or, with ``max_tokens``
    (``use_dynamic_bsz``), into as few as keep ``rows * padded_length <= max_tokens``."""
    if max_tokens:
        size = max(1, max_tokens // batch.input_ids.shape[1])
    size = max(multiple, size - size % multiple)  # e.g. DPO pairs are never split
    rows = list(range(len(batch)))
    if not rows:  # a sharded rank may hold none of a short batch's rows
        return []
    if size >= len(rows):
        return [batch]
    return [batch.select(rows[i : i + size]) for i in range(0, len(rows), size)]


def loss_inputs(
    keys: Tuple[str, ...], mb: ExperienceBatch, logprob: torch.Tensor
) -> Dict[str, torch.Tensor]:
    """The tensors a loss's parameters ``keys`` name: ``logprob`` as given, the others
    looked up in ``mb`` (``ExperienceBatch.tensor``)."""
    inputs: Dict[str, Optional[torch.Tensor]] = {}
    for key in keys:
        if key == "logprob":
            inputs[key] = logprob
        elif key == IS_WEIGHTS_KEY:  # only there with algorithm.rollout_correction.rollout_is
            inputs[key] = mb.extra.get(key)
        else:
            inputs[key] = mb.tensor(key)
    return inputs


def accumulate_gradients(
    model: torch.nn.Module,
    batch: ExperienceBatch,
    fns: LossFns,
    micro_batch_size: int,
    max_tokens: Optional[int] = None,
    lockstep: Optional[Any] = None,
    keep: Optional[List[torch.Tensor]] = None,
) -> Dict[str, float]:
    """Backward of the full loss over micro-batches (gradients summed, each scaled by its share).

    With ``lockstep`` (``distributed.Lockstep``) ``batch`` is this rank's part of the step's
    batch: shares are of the whole batch over all ranks, and zero-weight passes keep the
    ranks' model calls in step. ``keep`` (a list) receives each micro-batch's detached
    logprobs, in row order, on ``batch``'s device.
    """
    totals: Dict[str, float] = {}
    # Each micro-batch's loss is a mean over its own rows/tokens; weighting it by its share of
    # the whole batch makes the summed gradient equal that of the full-batch loss.
    by_tokens = fns.loss_agg_mode == "token-mean"
    whole: Any = batch.action_mask.sum() if by_tokens else len(batch)
    if lockstep is not None:  # every rank's tokens (rows): the whole batch's
        whole = lockstep.total(float(whole))
        whole = torch.tensor(whole, dtype=batch.action_mask.dtype) if by_tokens else int(whole)
    whole = whole.clamp(min=1.0) if by_tokens else whole
    parts = micro_batches(batch, micro_batch_size, max_tokens, fns.row_multiple)
    plan = lockstep.pad(parts) if lockstep is not None else [(mb, True) for mb in parts]
    device = model_device(model)
    for mb, real in plan:
        if not real:  # only to run the collectives: a zero gradient, no loss function
            logprob, _ = response_logprobs(model, mb, fns.temperature, False, False)
            (logprob.sum() * 0.0).backward()
            continue
        share = float(mb.action_mask.sum() / whole) if by_tokens else len(mb) / whole
        mb = mb.to(device)  # the loss functions read its tensors next to the logprobs
        logprob, entropy = response_logprobs(
            model, mb, fns.temperature, share_prefix=lockstep is None
        )
        if keep is not None:
            keep.append(logprob.detach().to(batch.input_ids.device))
        pg_loss, metrics = fns.policy_loss(**loss_inputs(fns.policy_loss.select_keys, mb, logprob))
        loss = pg_loss
        if mb.ref_logprob is not None:
            kl_loss, kl_metrics = fns.kl_loss.calculate_kl_loss(
                logprob, mb.ref_logprob, mb.action_mask, fns.loss_agg_mode
            )
            loss = loss + kl_loss
            metrics.update(kl_metrics)
        ent_loss, ent_metrics = fns.entropy_loss(
            entropy, mb.action_mask, fns.loss_agg_mode, expert_mask=mb.extra.get("expert_mask")
        )
        loss = loss + ent_loss
        metrics.update(ent_metrics)
        (loss * share).backward()
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + float(value) * share
    return totals


@torch.no_grad()
def response_scores(
    model: torch.nn.Module,
    batch: ExperienceBatch,
    micro_batch_size: int,
    temperature: float,
    max_tokens: Optional[int] = None,
    lockstep: Optional[Any] = None,
    with_entropy: bool = False,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(B, R) logprobs of the response under ``model``, without grad, and with
    ``with_entropy`` the (B, R) entropy of each token's distribution (else None), on
    ``batch``'s device (``lockstep``: as in ``accumulate_gradients``; the fillers' scores
    are dropped)."""
    parts = micro_batches(batch, micro_batch_size, max_tokens)
    plan = lockstep.pad(parts) if lockstep is not None else [(mb, True) for mb in parts]
    scored = [
        (response_logprobs(model, mb, temperature, with_entropy, lockstep is None), real)
        for mb, real in plan
    ]
    kept = [scores for scores, real in scored if real]
    if not kept:
        empty = torch.zeros(0, batch.response_len)
        return empty, empty.clone() if with_entropy else None
    # back where the batch is: the advantage and KL-in-reward steps run there
    device = batch.input_ids.device
    logprob = torch.cat([lp for lp, _ in kept], dim=0).to(device)
    entropy = torch.cat([h for _, h in kept], dim=0).to(device) if with_entropy else None
    return logprob, entropy
