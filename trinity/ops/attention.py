"""Shared-prefix ("cascade") attention: each distinct prompt's keys and values kept once.

A GRPO request asks for ``n`` samples of one prompt, so most of a batch's keys and values
belong to prompts that several rows share. ``SharedPrefixDecoder`` keeps each distinct
prompt's keys/values once and each row's own ones apart. A step attends to the two parts
separately and merges the two unnormalised softmaxes at their common max, which is exactly
attention over the concatenation ("cascade" attention). At batch sizes like 128, decode
attention on a CPU is bound by reading the cache, so reading a prompt once instead of ``n``
times is the saving; it also skips ``transformers``' per-step mask building.

Two callers, which is why this sits below both (``trinity.ops``): the rollout engine decodes
with it (``trinity/engine/decoding.py``, where the other decoder is), and the trainer scores
GRPO groups with ``SharedPrefixDecoder.extend``, which feeds many tokens per row in one
differentiable pass (``trinity/trainer/shared_prefix.py``). ``cache_kwargs`` /
``output_cache`` pass and read a KV cache under the name the installed ``transformers`` uses.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from trinity.ops import llama_forward
from trinity.ops.decode_attention import decode_attention
from trinity.ops.kv_cache import GrowingLayer, pad_front


@functools.cache
def _cache_parameter(model_cls: type) -> str:
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: Any, cache: Any) -> Dict[str, Any]:
    """``{name: cache}`` for ``model.forward``: transformers 5.24 renamed its
    ``past_key_values`` argument to ``cache`` (the old name warns, and goes in 5.40). A peft
    model passes keyword arguments on to its base model, whose signature says."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_parameter(type(base)): cache}


def output_cache(output: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned, under either name."""
    return output.get("cache", output.get("past_key_values"))


__all__ = [
    "SharedPrefixDecoder",
    "cache_kwargs",
    "output_cache",
    "register_attention",
    "sdpa_unless",
    "supports_shared_prefix",
]

# torch's CPU flash-attention kernel has a backward costing about 0.15 ms per (row, head)
# whatever the length (torch 2.13, 2 cores, bf16: 87 ms for 64 rows x 9 heads x 40 tokens
# against 7.6 ms for its math kernel; forward + backward even at 256 tokens, flash ahead at
# 1024: docs/performance.md, "Attention's backward on CPU"). Written-out attention keeps
# the (L, L) weights for the backward, so the trainer's prompt pass uses it only up to this
# many tokens. (torch's own kernel choice, ``sdpa_kernel``, is process-wide: it would switch
# the kernels of an engine prefilling in another thread too.)
MATH_BACKWARD_MAX_LEN = 128


ATTENTION = "trinity_shared_prefix"  # the name registered in transformers' AttentionInterface
FIRST_CAPACITY = 64  # room for 64 new tokens first: most responses are short, buffers double
_NO_MASK = torch.ones((1, 1, 1, 1), dtype=torch.bool)  # see SharedPrefixDecoder._forward


def supports_shared_prefix(model: PreTrainedModel) -> bool:
    """Whether ``model`` can decode with ``SharedPrefixDecoder``: every layer is plain full
    attention reached through ``transformers``' attention interface, without soft-capping."""
    config = model.config
    return (
        getattr(model, "_supports_attention_backend", False)
        and getattr(config, "attn_logit_softcapping", None) is None
        and all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)
    )


class _PrefixCache(DynamicCache):
    """Keys/values of each distinct prompt (P rows), then each row's own (B rows).

    ``source[b]`` is the prompt of row ``b``. For the grouped prefix matmul, row ``b``
    sits at ``slot[b]`` of a (P * width) layout, ``width`` being the largest group.
    """

    def __init__(
        self, config: object, prompt_mask: torch.Tensor, source: torch.Tensor, capacity: int
    ) -> None:
        super().__init__(config=config)
        self.layers = [GrowingLayer(capacity) for _ in self.layers]
        self.prefix: list = [None] * len(self.layers)  # per layer: (keys, values), P rows
        self.prefix_bias = torch.zeros(prompt_mask.shape, device=prompt_mask.device)
        self.prefix_bias.masked_fill_(~prompt_mask, float("-inf"))  # (P, W): padding keys
        self.prompt_mask = prompt_mask
        self.groups = prompt_mask.shape[0]
        self.decoding = False
        # Set for one packed pass (``SharedPrefixDecoder.extend`` with ``lengths``): the
        # padded (row * width + column) slot of each packed token, and the width.
        self.packed: Optional[Tuple[torch.Tensor, int]] = None
        # Rows that joined mid-decode hold no own keys before their first token: a row's own
        # columns before ``own_start`` are masked, when ``ragged`` says some row has any.
        self.own_start = torch.zeros(len(source), dtype=torch.long, device=source.device)
        self.ragged = False
        self.rows_version = 0
        # (key, bias) of the current decode step, shared by its layers (``decode_attention``)
        self.step_bias: Optional[Tuple[Tuple[int, ...], torch.Tensor]] = None
        self.set_rows(source)

    def grouped(self, t: torch.Tensor) -> torch.Tensor:
        """Rows to prompt groups: (B, Hkv, M, X) -> (P, Hkv, width * M, X), row ``b`` at
        ``slot[b]`` of its group's ``width`` and free slots zero, for one matmul per prompt."""
        if self.dense:
            grouped = t.view(self.groups, self.width, *t.shape[1:])
        else:
            grouped = t.new_zeros((self.groups * self.width, *t.shape[1:]))
            grouped[self.slot] = t
            grouped = grouped.view(self.groups, self.width, *t.shape[1:])
        return grouped.permute(0, 2, 1, 3, 4).reshape(self.groups, t.shape[1], -1, t.shape[-1])

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """``grouped``'s inverse: (P, Hkv, width * M, X) -> (B, Hkv, M, X)."""
        per_slot = t.view(self.groups, t.shape[1], self.width, -1, t.shape[-1]).transpose(1, 2)
        per_slot = per_slot.reshape(self.groups * self.width, *per_slot.shape[2:])
        return per_slot if self.dense else per_slot[self.slot]

    def set_rows(self, source: torch.Tensor) -> None:
        self.rows_version += 1  # what ``decode_attention.step_bias`` keys its reuse on
        counts = torch.bincount(source, minlength=self.groups)
        self.width = int(counts.max())
        order = torch.sort(source, stable=True).indices
        rank = torch.empty_like(source)
        starts = counts.cumsum(0) - counts
        rank[order] = torch.arange(len(source), device=source.device) - starts[source[order]]
        self.source, self.slot = source, source * self.width + rank
        self.dense = len(source) == self.groups * self.width and bool(
            (self.slot == torch.arange(len(source), device=source.device)).all()
        )

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if not self.decoding:  # the prefill: these are the prompts' keys/values
            # Contiguous once here, or every decode step's matmul would copy them.
            self.prefix[layer_idx] = (key_states.contiguous(), value_states.contiguous())
            return key_states, value_states
        if self.packed is not None:  # a final scoring pass: nothing to keep
            return key_states, value_states
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.prompt_mask.shape[1] + self.layers[layer_idx].get_seq_length()

    def select_rows(self, keep: torch.Tensor) -> None:
        for layer in self.layers:
            if layer.is_initialized:
                layer.batch_select_indices(keep)
        self.own_start = self.own_start[keep]
        self.source = self.source[keep]
        if self.ragged or len(self.prefix_bias) > 1:
            self._compact()
        self.set_rows(self.source)

    def add(self, joining: _PrefixCache) -> None:
        """Append the rows of ``joining`` (a prefill of other prompts): their prompts become
        groups here, the narrower prompts' left padding growing to the wider width, and their
        own columns start empty at this cache's current column."""
        width = max(self.prompt_mask.shape[1], joining.prompt_mask.shape[1])

        def both(mine: torch.Tensor, theirs: torch.Tensor, dim: int, pad: Any) -> torch.Tensor:
            parts = [pad_front(t, width - t.shape[dim], dim, pad) for t in (mine, theirs)]
            return torch.cat(parts)

        self.prefix = [
            (both(k, jk, 2, 0), both(v, jv, 2, 0))
            for (k, v), (jk, jv) in zip(self.prefix, joining.prefix, strict=True)
        ]
        self.prompt_mask = both(self.prompt_mask, joining.prompt_mask, 1, False)
        self.prefix_bias = both(self.prefix_bias, joining.prefix_bias, 1, float("-inf"))
        own = self.layers[0].get_seq_length()
        for layer, (keys, values) in zip(self.layers, joining.prefix, strict=True):
            empty = (len(joining.source), keys.shape[1], own, keys.shape[-1])
            layer.append_rows(keys.new_zeros(empty), values.new_zeros(empty))
        self.own_start = torch.cat([self.own_start, torch.full_like(joining.source, own)])
        self.ragged = self.ragged or own > 0
        self.source = torch.cat([self.source, joining.source + self.groups])
        self.groups += joining.groups
        self.set_rows(self.source)

    def _compact(self) -> None:
        """Forget what no running row reads: prompts without rows (once they are half of
        all, so the copying stays amortised), prompt columns that are padding in every
        kept prompt, and own columns before every row's first."""
        used = torch.bincount(self.source, minlength=self.groups) > 0
        kept = int(used.sum())
        if 0 < kept <= self.groups // 2:
            index = used.nonzero().squeeze(1)
            self.prefix = [(k[index], v[index]) for k, v in self.prefix]
            self.prompt_mask, self.prefix_bias = self.prompt_mask[index], self.prefix_bias[index]
            self.source = (used.cumsum(0) - 1)[self.source]
            self.groups = kept
            first = int(self.prompt_mask.any(dim=0).int().argmax())
            if first:
                self.prefix = [(k[:, :, first:], v[:, :, first:]) for k, v in self.prefix]
                self.prompt_mask = self.prompt_mask[:, first:]
                self.prefix_bias = self.prefix_bias[:, first:]
        if self.ragged and len(self.own_start):
            start = int(self.own_start.min())
            if start and 2 * start >= self.layers[0].get_seq_length():
                for layer in self.layers:
                    layer.shift(start)
                self.own_start = self.own_start - start
            self.ragged = bool(self.own_start.any())


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor]):
    """Softmax attention left unnormalised, so two parts can be merged exactly.

    q: (..., Q, D) already scaled; k: (..., K, D), or (..., K', D) with K' >= K, of which the
    first K are the keys (a buffer the keys fill from the front); v: (..., K, Dv); bias
    broadcast to (..., Q, K) or None. Returns, in fp32, (..., Q, Dv + 2): ``sum_k exp(s_k -
    m) v_k``, then the row's max score ``m``, then ``sum_k exp(s_k - m)``.
    """
    scores = torch.matmul(q, k.transpose(-1, -2))[..., : v.shape[-2]].float()
    if bias is not None:
        scores = scores + bias
    top = scores.amax(dim=-1, keepdim=True)
    weights = (scores - top).exp()
    out = torch.matmul(weights.to(v.dtype), v).float()
    return torch.cat([out, top, weights.sum(dim=-1, keepdim=True)], dim=-1)


def _cascade_attention(cache: _PrefixCache, layer_idx: int, query, key, value, scaling: float):
    """Q new tokens per row: attend to the row's prompt (grouped) and, causally, to its own
    tokens. query: (B, H, Q, D); key/value: (B, Hkv, K, D), the row's own keys so far
    (K >= Q, the last Q being the new ones). Returns (B, H, Q, Dv)."""
    rows, heads, width_q, dim = query.shape
    kv_heads, own = key.shape[1], key.shape[2]
    # (B, Hkv, G*Q, D): query head h reads kv head h // G, as transformers' repeat_kv does.
    q = (query * scaling).reshape(rows, kv_heads, -1, dim)
    prefix_k, prefix_v = cache.prefix[layer_idx]  # (P, Hkv, W, D)
    bias = cache.prefix_bias[:, None, None, :]
    part_p = cache.rows(_attend(cache.grouped(q), prefix_k, prefix_v, bias))  # (B, Hkv, G*Q, Dv+2)
    bias = None
    if width_q > 1:  # new token i sees the row's earlier tokens and new tokens 0..i
        allowed = torch.ones((width_q, own), dtype=torch.bool, device=q.device)
        allowed = allowed.tril(diagonal=own - width_q).repeat(heads // kv_heads, 1)
        bias = torch.zeros(allowed.shape, device=q.device).masked_fill_(~allowed, float("-inf"))
    if cache.ragged:  # a row that joined late has no own keys before its first token
        before = torch.arange(own, device=q.device) < cache.own_start[:, None]
        late = torch.zeros(before.shape, device=q.device).masked_fill_(before, float("-inf"))
        bias = late[:, None, None, :] if bias is None else bias + late[:, None, None, :]
    if cache.packed is None and not torch.is_grad_enabled():
        # Scores against the rows' whole key buffer, then cut to the keys written: given
        # the keys as a slice of the buffer, the matmul copies them at every call
        # (SmolLM2, 64 rows: 157 us a layer, twice the matmul's own time).
        key = cache.layers[layer_idx].buffers()[0]
    part_s = _attend(q, key, value, bias)  # (B, Hkv, G*Q, Dv + 2)
    # Rescale both parts to their common max: exactly softmax over prompt + own keys.
    top = torch.maximum(part_p[..., -2:-1], part_s[..., -2:-1])
    w_p, w_s = (part_p[..., -2:-1] - top).exp(), (part_s[..., -2:-1] - top).exp()
    total = w_p * part_p[..., -1:] + w_s * part_s[..., -1:]
    out = (w_p * part_p[..., :-2] + w_s * part_s[..., :-2]) / total
    return out.to(query.dtype).reshape(rows, heads, width_q, -1)


def _packed_attention(cache: _PrefixCache, layer_idx: int, query, key, value, scaling: float):
    """Cascade attention for packed tokens (1, H, N, D): laid out per row (padding where a
    row is shorter) for attention only, so the layers around it run on real tokens alone."""
    slots, width = cache.packed
    rows = len(cache.source)

    def unpack(t: torch.Tensor) -> torch.Tensor:  # (1, h, N, d) -> (B, h, width, d)
        flat = t.new_zeros((rows * width, t.shape[1], t.shape[-1]))
        flat = flat.index_copy(0, slots, t[0].transpose(0, 1))
        return flat.view(rows, width, t.shape[1], t.shape[-1]).transpose(1, 2)

    out = _cascade_attention(cache, layer_idx, unpack(query), unpack(key), unpack(value), scaling)
    out = out.transpose(1, 2).reshape(rows * width, *out.shape[1:2], -1).index_select(0, slots)
    return out.transpose(0, 1)[None]  # (1, H, N, Dv)


def _prefill_attention(cache: _PrefixCache, query, key, value, scaling: float):
    """Causal attention over left-padded prompts; a padding query sees itself only, so no
    row of the softmax is empty (its output is never used)."""
    width = query.shape[2]
    causal = torch.ones((width, width), dtype=torch.bool, device=query.device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=query.device)
    mask = causal & (cache.prompt_mask[:, None, None, :] | eye)
    if query.requires_grad and query.device.type == "cpu" and width <= MATH_BACKWARD_MAX_LEN:
        return _written_out_attention(query, key, value, mask, scaling)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )


def _written_out_attention(query, key, value, mask, scaling: float) -> torch.Tensor:
    """Softmax attention as plain matmuls, for short passes to differentiate on CPU
    (``MATH_BACKWARD_MAX_LEN``). query (B, H, Q, D), key/value (B, Hkv, K, D), mask
    broadcast to (B, H, Q, K) (True: attend) -> (B, H, Q, Dv); softmax in fp32."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scaling
    weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return torch.matmul(weights.to(value.dtype), value)


def sdpa_unless(kwarg: str, special: Callable[..., Any]) -> Callable[..., Any]:
    """An ``AttentionInterface`` function: ``special(module, query, key, value, state,
    scaling)`` when the model's forward was given the kwarg ``kwarg`` (its value being
    ``state``), else plain SDPA with the usual mask, so any other forward of the model (e.g.
    ``model.generate``) is unaffected. (B, H, Q, D) in, (B, Q, H, Dv) out, as transformers
    expects."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        state = kw.pop(kwarg, None)
        if state is None:
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kw
            )
        return special(module, query, key, value, state, scaling)

    return attention


def register_attention(name: str, attention: Callable[..., Any]) -> None:
    """Register ``attention`` with transformers as ``name``; ordinary forwards get SDPA's
    masks, and the special ones pass a 4D mask, which transformers passes on untouched."""
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)


def _shared_prefix_attention(module, query, key, value, cache: _PrefixCache, scaling):
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if cache.packed is not None:
        out = _packed_attention(cache, module.layer_idx, query, key, value, scaling)
    elif cache.decoding and query.shape[2] == 1 and not torch.is_grad_enabled():
        out = decode_attention(cache, module.layer_idx, query, scaling)
    elif cache.decoding:
        out = _cascade_attention(cache, module.layer_idx, query, key, value, scaling)
    else:
        out = _prefill_attention(cache, query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None


def _attend_own(cache: _PrefixCache, module: Any, query, key, value) -> torch.Tensor:
    """``_shared_prefix_attention`` for ``llama_forward``: this pass's keys/values (B, Hkv,
    Q, D) go into the cache here, as transformers' attention module puts them."""
    key, value = cache.update(key, value, module.layer_idx)
    return _shared_prefix_attention(module, query, key, value, cache, module.scaling)[0]


# The cache comes through the forward kwarg ``shared_prefix_cache``.
register_attention(ATTENTION, sdpa_unless("shared_prefix_cache", _shared_prefix_attention))


class SharedPrefixDecoder:
    """Decode with one cache copy per distinct prompt (see the module docstring); rows of
    other prompts can ``join`` mid-decode."""

    joinable = True

    def __init__(
        self,
        model: PreTrainedModel,
        ids,
        mask,
        source,
        steps: int,
        body: Optional[torch.nn.Module] = None,
    ) -> None:
        """ids/mask: (P, W) left-padded distinct prompts; source: (B,) prompt of each row.
        ``body``: ``model``'s decoder without its output head, run instead of ``model``:
        every output (``logits``, ``step``, ``extend``) is then final hidden states (H
        wide, not V), which the trainer scores a chunk at a time."""
        if model.config._attn_implementation != ATTENTION:
            model.set_attn_implementation(ATTENTION)
        self.model = model if body is None else body
        self.hidden = body is not None
        self.own = None if self.hidden else llama_forward.of(model)
        self.capacity = min(steps, FIRST_CAPACITY)
        self.cache, self.logits = self._prefill(ids, mask, source)  # (B, V) (B, H with body)
        self.position = mask.sum(dim=-1)[source]  # (B,) position of the next token

    def _prefill(self, ids, mask, source) -> Tuple[_PrefixCache, torch.Tensor]:
        """A cache holding prompts ``ids``/``mask`` (P, W), and rows ``source``' logits."""
        cache = _PrefixCache(self.model.config, mask.bool(), source, self.capacity)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        if self._own(cache):
            out = self.own(ids, positions, functools.partial(_attend_own, cache), last_only=True)
        else:
            # The decoder has no head, so nothing to skip: it returns every prompt position.
            keep = {} if self.hidden else {"logits_to_keep": 1}
            out = self._output(
                self.model(
                    input_ids=ids,
                    position_ids=positions,
                    **cache_kwargs(self.model, cache),
                    use_cache=True,
                    shared_prefix_cache=cache,
                    **keep,
                )
            )
        cache.decoding = True
        return cache, out[:, -1, :][source]

    def _own(self, cache: _PrefixCache) -> bool:
        """Whether this pass runs ``llama_forward`` (no autograd, not a packed pass)."""
        return self.own is not None and cache.packed is None and not torch.is_grad_enabled()

    def _output(self, out: Any) -> torch.Tensor:
        return out.last_hidden_state if self.hidden else out.logits

    def join(self, ids, mask, source) -> torch.Tensor:
        """Prefill other prompts ``ids``/``mask`` (P', W') and append rows ``source`` (B',)
        of them after the running ones; returns the new rows' next-token logits (B', V)."""
        joining, logits = self._prefill(ids, mask, source)
        self.cache.add(joining)
        self.position = torch.cat([self.position, mask.sum(dim=-1)[source]])
        return logits

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows ``keep`` (indices into the current rows)."""
        self.cache.select_rows(keep)
        self.position = self.position[keep]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,); return the next-token logits (B, V)."""
        return self.extend(tokens[:, None])[:, -1, :]

    def extend(self, tokens: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Feed Q tokens per row (B, Q) in one pass; return their logits (B, Q, V).

        Differentiable: the trainer scores whole responses this way (``trinity/trainer/
        shared_prefix.py``), with gradients reaching the prompt states through the cache.
        With ``lengths`` (B,), only each row's first ``lengths[b]`` tokens are real: the
        pass runs on those alone, packed (padding logits are 0), and keeps nothing, so it
        must be the decoder's last.
        """
        rows, width = tokens.shape
        positions = self.position[:, None] + torch.arange(width, device=tokens.device)
        self.position = self.position + width
        if lengths is None:
            return self._forward(tokens, positions)
        real = torch.arange(width, device=tokens.device) < lengths[:, None]
        slots = real.flatten().nonzero().squeeze(1)
        self.cache.packed = (slots, width)
        try:
            packed = self._forward(tokens.flatten()[slots][None], positions.flatten()[slots][None])
        finally:
            self.cache.packed = None
        logits = packed.new_zeros((rows * width, packed.shape[-1]))
        return logits.index_copy(0, slots, packed[0]).view(rows, width, -1)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self._own(self.cache):
            return self.own(tokens, positions, functools.partial(_attend_own, self.cache))
        out = self.model(
            input_ids=tokens,
            position_ids=positions,
            # A prepared (4D) mask is passed through as is: our attention builds its own,
            # and transformers would otherwise build a (Q x (P + Q)) one per forward.
            attention_mask=_NO_MASK,
            **cache_kwargs(self.model, self.cache),
            use_cache=True,
            shared_prefix_cache=self.cache,
        )
        return self._output(out)
