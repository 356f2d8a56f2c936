"""Fixed-shape decoding for the transformers engine: the shapes a CUDA graph needs.

``StaticDecoder`` decodes a batch whose tensors never change shape or address. The keys and
values of every layer live in buffers (rows, kv heads, columns, head dim) allocated once; a
step writes its column in place (``index_copy_`` at a column index held on the device) and
attends over all columns under a mask; a row that finished keeps being computed (its tokens
are not read) instead of being dropped. Every step thus runs the same kernels on the same
memory, so on a CUDA device the step is captured once as a CUDA graph and replayed: one
launch per token instead of several hundred, which is what bounds a small model's decoding
on a GPU. Without ``graphs`` the same step runs eagerly; the CPU tests compare it with the
other decoders (``decoding.py``) token for token.

The batch is padded to ``bucket_rows`` rows and ``COLUMN_BLOCK``-rounded columns, and the
engine keeps the ``StaticSlots`` (buffers and graph) of the last shape, so the batches of an
RL run, which have the same sizes, reuse one capture. The cost: attention reads every
column of the buffer each step, not only the filled ones, so on a CPU, where decoding is
bound by reading the cache, the growing decoders stay the engine's choice.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from trinity.engine.decoding import prefill
from trinity.ops.attention import register_attention, sdpa_unless

__all__ = ["StaticDecoder", "StaticSlots", "bucket_rows", "static_columns"]

ATTENTION = "trinity_static"  # the name registered in transformers' AttentionInterface
COLUMN_BLOCK = 128  # columns are rounded up to a multiple: similar batches share a capture
MIN_ROWS = 8


def bucket_rows(rows: int) -> int:
    """Rows of the buffers for a batch of ``rows``: the next power of two, at least 8."""
    return max(MIN_ROWS, 1 << (rows - 1).bit_length())


def static_columns(prompt_width: int, steps: int) -> int:
    """Columns of the buffers for prompts ``prompt_width`` wide and ``steps`` new tokens (the
    last sampled token is never fed back), rounded up to ``COLUMN_BLOCK``."""
    needed = prompt_width + max(steps - 1, 1)
    return -(-needed // COLUMN_BLOCK) * COLUMN_BLOCK


class StaticSlots:
    """The fixed buffers of one batch shape, and its CUDA graph once captured.

    ``keys``/``values``: per layer (rows, kv heads, columns, head dim), allocated at the first
    prefill. ``prompt``: (rows, columns) bool, the real prompt columns; generated tokens fill
    columns ``start`` to ``column``. ``ids``/``position``: (rows, 1) the step's input.
    """

    def __init__(self, rows: int, columns: int, device: torch.device, graphs: bool) -> None:
        self.rows, self.columns, self.graphs = rows, columns, graphs
        self.keys: List[torch.Tensor] = []
        self.values: List[torch.Tensor] = []
        self.prompt = torch.zeros((rows, columns), dtype=torch.bool, device=device)
        self.start = torch.zeros(1, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.position = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.arange = torch.arange(columns, device=device)
        # The model is given a 4D mask, which transformers passes on without building one.
        self.no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
        self.allowed: Optional[torch.Tensor] = None  # (rows, 1, 1, columns), set each step
        self.graph: Optional[Any] = None  # torch.cuda.CUDAGraph
        self.logits: Optional[torch.Tensor] = None  # the graph's output (rows, V)

    def fits(self, rows: int, columns: int, graphs: bool) -> bool:
        return (self.rows, self.columns, self.graphs) == (rows, columns, graphs)

    def prefill(self, model: PreTrainedModel, ids, mask, source) -> torch.Tensor:
        """Run the distinct prompts ``ids``/``mask`` (P, W) through ``model`` with its own
        attention, copy their keys/values to rows ``source`` (B,), and return those rows'
        next-token logits (B, V)."""
        cache = DynamicCache(config=model.config)
        out = prefill(model, ids, mask, cache)
        width, n = ids.shape[1], len(source)
        if not self.keys:
            self._allocate([(layer.keys, layer.values) for layer in cache.layers])
        for layer, keys, values in zip(cache.layers, self.keys, self.values, strict=True):
            keys[:n, :, :width] = layer.keys[source]
            values[:n, :, :width] = layer.values[source]
        self.prompt.zero_()
        self.prompt[:n, :width] = mask[source].bool()
        self.start.fill_(width)
        self.column.fill_(width)
        self.position.zero_()
        self.position[:n, 0] = mask.sum(dim=-1)[source]
        return out.logits[:, -1, :][source]

    def _allocate(self, layers: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        for keys, values in layers:  # (P, kv heads, W, head dim) each
            shape = (self.rows, keys.shape[1], self.columns)
            self.keys.append(keys.new_zeros((*shape, keys.shape[-1])))
            self.values.append(values.new_zeros((*shape, values.shape[-1])))

    def run(self, model: PreTrainedModel) -> torch.Tensor:
        """One decode step of every row from ``ids``/``position``; the logits (rows, V). The
        CUDA graph's output is overwritten by the next step: callers index it (a copy)."""
        if self.graphs and self.graph is None:
            self._capture(model)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._step(model)
        self.column += 1
        self.position += 1
        return logits

    def _step(self, model: PreTrainedModel) -> torch.Tensor:
        generated = (self.arange >= self.start) & (self.arange <= self.column)
        self.allowed = (self.prompt | generated)[:, None, None, :]
        return model(
            input_ids=self.ids,
            position_ids=self.position,
            attention_mask=self.no_mask,
            use_cache=False,
            static_slots=self,
        ).logits[:, -1, :]

    def _capture(self, model: PreTrainedModel) -> None:
        # The warm-up step (lazy initialisations, cuBLAS workspaces off the graph) writes
        # the same cache column the replay then writes again, so it changes nothing.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step(model)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step(model)

    def attend(self, layer: int, query, key, value, scaling: float) -> torch.Tensor:
        """Write this step's key/value (rows, kv heads, 1, d) at ``column`` and attend
        (rows, heads, 1, d) over the allowed columns; returns (rows, heads, 1, dv)."""
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(2, self.column, key)
        values.index_copy_(2, self.column, value)
        return F.scaled_dot_product_attention(
            query,
            keys,
            values,
            attn_mask=self.allowed,
            scale=scaling,
            enable_gqa=keys.shape[1] != query.shape[1],
        )


def _static_step(module: torch.nn.Module, query, key, value, slots: StaticSlots, scaling):
    """A decode step's attention through ``slots``: (B, H, 1, D) in, (B, 1, H, Dv) out."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = slots.attend(module.layer_idx, query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None


# A decode step's attention goes through the slots passed as the forward kwarg
# ``static_slots``; any other forward (the prefill, ``generate``) is plain SDPA.
register_attention(ATTENTION, sdpa_unless("static_slots", _static_step))


class StaticDecoder:
    """The decoder interface of ``decoding.py`` over ``StaticSlots``: ``select`` only
    records which rows still run; every step computes all of them.

    Rows cannot join mid-decode (``joinable``): the slots share one column counter and a
    fixed column count, so a late row would need its prompt moved to the running column and
    the buffers shifted when the columns run out. The engine's stream instead starts the
    next batch once every row has ended (``streaming.py``).
    """

    joinable = False

    def __init__(self, model: PreTrainedModel, ids, mask, source, slots: StaticSlots) -> None:
        if model.config._attn_implementation != ATTENTION:
            model.set_attn_implementation(ATTENTION)
        self.model, self.slots = model, slots
        self.logits = slots.prefill(model, ids, mask, source)
        self.active = torch.arange(len(source), device=source.device)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows ``keep`` (indices into the current rows)."""
        self.active = self.active[keep]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per running row (B,); return their next-token logits (B, V)."""
        self.slots.ids[self.active, 0] = tokens
        return self.slots.run(self.model)[self.active]
