"""KV-cached decoding for the transformers engine: prefill once per distinct prompt, then step.

Two decoders do the same job:

- ``SharedPrefixDecoder`` (``trinity/ops/attention.py``: the engine's choice on CPU, where the
  model allows it) keeps each distinct prompt's keys/values once; see there.
- ``ExpandedDecoder`` copies each prompt's cache rows ``n`` times and runs the model's
  own attention with a padding mask. It serves models the first cannot (sliding-window
  layers, logit soft-capping, attention implementations that bypass the interface) and
  GPUs, where small decode steps are bound by kernel launches, not by memory.

Both grow their per-row cache in place (``GrowingLayer``), drop finished rows and take in
the rows of requests that arrive mid-decode (``join``), so a batch's slots refill.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from trinity.ops import attention
from trinity.ops.attention import SharedPrefixDecoder, cache_kwargs, supports_shared_prefix
from trinity.ops.kv_cache import GrowingLayer

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
        self.room = min(steps, attention.FIRST_CAPACITY)
        self.cache, self.logits = self._prefill(ids, mask, source)
        self.columns = ids.shape[1]
        self.attention = torch.ones(
            (len(source), self.columns + self.room), dtype=mask.dtype, device=mask.device
        )
        self.attention[:, : self.columns] = mask[source]
        self.position = mask.sum(dim=-1)[source]
        # Rows join by aligning their caches column for column, which a layer that keeps a
        # sliding window of its own cannot do.
        self.joinable = all(isinstance(layer, GrowingLayer) for layer in self.cache.layers)

    def _prefill(self, ids, mask, source) -> Tuple[DynamicCache, torch.Tensor]:
        """A cache of prompts ``ids``/``mask`` (P, W) copied to rows ``source``, and the
        rows' next-token logits."""
        cache = DynamicCache(config=self.model.config)
        cache.layers = [
            GrowingLayer(ids.shape[1] + self.room) if type(layer) is DynamicLayer else layer
            for layer in cache.layers
        ]
        out = prefill(self.model, ids, mask, cache)
        cache.batch_select_indices(source)
        return cache, out.logits[:, -1, :][source]

    def join(self, ids, mask, source) -> torch.Tensor:
        """Prefill other prompts ``ids``/``mask`` (P', W') and append rows ``source`` (B',)
        of them, their prompts ending at the running rows' last column (left padding grows
        where a new prompt is longer); returns the new rows' next-token logits (B', V)."""
        joining, logits = self._prefill(ids, mask, source)
        width = ids.shape[1]
        if width > self.columns:
            for layer in self.cache.layers:
                layer.shift(self.columns - width)
            self.attention = F.pad(self.attention, (width - self.columns, 0))
            self.columns = width
        front = self.columns - width
        rows = self.attention.new_ones((len(source), self.attention.shape[1]))
        rows[:, : self.columns] = F.pad(mask[source], (front, 0))
        for layer, new in zip(self.cache.layers, joining.layers, strict=True):
            layer.append_rows(*(F.pad(t, (0, 0, front, 0)) for t in (new.keys, new.values)))
        self.attention = torch.cat([self.attention, rows])
        self.position = torch.cat([self.position, mask.sum(dim=-1)[source]])
        return logits

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.attention, self.position = self.attention[keep], self.position[keep]
        if not self.joinable or not len(keep):
            return
        # Columns no running row attends to any more (left padding of prompts that left,
        # or of a longer prompt that joined) are dropped once they are half of the cache.
        first = int(self.attention[:, : self.columns].any(dim=0).int().argmax())
        if first and 2 * first >= self.columns:
            for layer in self.cache.layers:
                layer.shift(first)
            self.attention = self.attention[:, first:]
            self.columns -= first

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.columns == self.attention.shape[1]:  # room for more tokens: ones, doubled
            self.attention = F.pad(self.attention, (0, self.columns), value=1)
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
