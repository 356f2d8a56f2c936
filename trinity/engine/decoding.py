"""KV-cached decoding for the transformers engine: prefill once per distinct prompt, then step.

Two decoders do the same job:

- ``SharedPrefixDecoder`` (``trinity/ops/attention.py``: the engine's choice on CPU, where the
  model allows it) keeps each distinct prompt's keys/values once; see there.
- ``ExpandedDecoder`` copies each prompt's cache rows ``n`` times and runs the model's
  own attention with a padding mask. It serves models the first cannot (sliding-window
  layers, logit soft-capping, attention implementations that bypass the interface) and
  GPUs, where small decode steps are bound by kernel launches, not by memory.

Both grow their per-row cache in place (``GrowingLayer``) and can drop finished rows.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from trinity.ops import attention
from trinity.ops.attention import (
    GrowingLayer,
    SharedPrefixDecoder,
    cache_kwargs,
    supports_shared_prefix,
)

__all__ = [
    "ExpandedDecoder",
    "SharedPrefixDecoder",
    "make_decoder",
    "prefill",
    "supports_shared_prefix",
]


class ExpandedDecoder:
    """Decode with each prompt's cache copied to its rows and the model's own attention."""

    def __init__(self, model: PreTrainedModel, ids, mask, source, steps: int) -> None:
        self.model = model
        width = ids.shape[1]
        self.cache = DynamicCache(config=model.config)
        self.cache.layers = [
            GrowingLayer(width + min(steps, attention.FIRST_CAPACITY))
            if type(layer) is DynamicLayer
            else layer
            for layer in self.cache.layers
        ]
        out = prefill(model, ids, mask, self.cache)
        self.cache.batch_select_indices(source)
        self.logits = out.logits[:, -1, :][source]
        self.attention = torch.ones(
            (len(source), width + steps), dtype=mask.dtype, device=mask.device
        )
        self.attention[:, :width] = mask[source]
        self.columns = width
        self.position = mask.sum(dim=-1)[source]

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.attention, self.position = self.attention[keep], self.position[keep]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.columns += 1
        logits = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attention[:, : self.columns],
            position_ids=self.position[:, None],
            **cache_kwargs(self.model, self.cache),
            use_cache=True,
        ).logits[:, -1, :]
        self.position = self.position + 1
        return logits


def prefill(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache):
    """The model's forward over left-padded prompts ``ids``/``mask`` (P, W) into ``cache``,
    only the last column's logits computed."""
    return model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(dim=-1) - 1).clamp(min=0),
        **cache_kwargs(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )


def make_decoder(model: PreTrainedModel, ids, mask, source, steps: int, shared: bool):
    """Prefill ``ids`` (P, W) and return a decoder for rows ``source`` (B,)."""
    cls = SharedPrefixDecoder if shared else ExpandedDecoder
    return cls(model, ids, mask, source, steps)
