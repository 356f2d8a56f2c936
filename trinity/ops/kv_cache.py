"""Per-row KV caches that grow in place: the rollout engine's decoders keep their rows'
keys and values in ``GrowingLayer``s (``trinity/engine/decoding.py``, ``attention.py``), which
also take in rows that join a running batch and shift columns when left padding grows or
columns nobody reads any more are dropped.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from transformers.cache_utils import DynamicLayer

__all__ = ["GrowingLayer", "pad_front"]


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes into a buffer which doubles when full.

    The stock layer grows by ``torch.cat`` every step, copying the whole cache per token
    (a third of decode time on the tiny model). Here a step writes one column in place
    and the amortised copy cost is O(1) per token, while memory stays within twice the
    longest running sequence (reserving ``max_tokens`` up front would not fit long
    generations on a GPU).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: Optional[torch.Tensor] = None
        self._v: Optional[torch.Tensor] = None

    def _reserve(self, end: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if self._k is not None and end <= self._k.shape[2]:
            return
        capacity = max(end, self.capacity if self._k is None else 2 * self._k.shape[2])
        batch, heads = key_states.shape[:2]
        # zeros, not empty: the decode step reads whole buffers, unwritten columns masked,
        # and a masked score or a 0 weight still meets them (0 * nan is nan)
        k = key_states.new_zeros((batch, heads, capacity, key_states.shape[-1]))
        v = value_states.new_zeros((batch, heads, capacity, value_states.shape[-1]))
        if self.length:
            k[:, :, : self.length] = self.keys
            v[:, :, : self.length] = self.values
        self._k, self._v = k, v

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def buffers(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers (B, heads, capacity, d): the first ``length``
        columns are the cache, the rest zeros or stale (finite) columns."""
        return self._k, self._v

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (B',), in that order. Without autograd and with B' at most
        the rows held, only the rows whose place changes are copied, within the buffers,
        which then end at B' rows: the stream drops finished rows by moving the last running
        rows into their places (``streaming.py``), a few rows' copy instead of the whole
        cache's (about 10 ms at SmolLM2's 64 rows, each time a row ends)."""
        rows = len(indices)
        if rows > len(self._k) or self._k.requires_grad:
            self._k, self._v = self._k[indices], self._v[indices]
        else:
            moved = (indices != torch.arange(rows, device=indices.device)).nonzero().squeeze(1)
            if len(moved):
                source = indices[moved]  # gathered before the writes: overlaps are safe
                self._k[moved], self._v[moved] = self._k[source], self._v[source]
            self._k, self._v = self._k[:rows], self._v[:rows]
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows (N, kv heads, ``length``, d) after the current ones (rows joining a
        running batch; their columns are already aligned to this cache's)."""
        if self._k is None:  # nothing stored yet: the first update brings every row
            return
        rows = []
        for buffer, new in ((self._k, keys), (self._v, values)):
            # zeros, not empty: a masked column still meets a 0 weight, and 0 * nan is nan
            row = buffer.new_zeros((len(new), *buffer.shape[1:]))
            row[:, :, : self.length] = new
            rows.append(torch.cat([buffer, row]))
        self._k, self._v = rows
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def shift(self, columns: int) -> None:
        """Drop the first ``columns`` columns of every row, or, when negative, put that many
        zero columns in front (left padding grown for a longer row joining)."""
        if self._k is None:
            return
        keep = max(0, columns)
        front = max(0, -columns)
        self.length = self.length - keep + front
        capacity = max(self.length, self._k.shape[2])
        moved = []
        for buffer in (self._k, self._v):
            shifted = buffer.new_zeros((*buffer.shape[:2], capacity, buffer.shape[-1]))
            shifted[:, :, front : self.length] = buffer[:, :, keep : self.length - front + keep]
            moved.append(shifted)
        self._k, self._v = moved
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]


def pad_front(t: torch.Tensor, count: int, dim: int, value: Any) -> torch.Tensor:
    """``t`` with ``count`` columns of ``value`` put in front along ``dim``."""
    if count == 0:
        return t
    shape = list(t.shape)
    shape[dim] = count
    return torch.cat([t.new_full(shape, value), t], dim=dim)
