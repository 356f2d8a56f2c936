"""The engine's one-token decode attention (``trinity/ops/decode_attention.py``) against
attention written out from its definition: row b's query against its prompt's real keys
then its own written keys, one softmax, on dense groups, after rows ended, and with rows
that joined mid-decode (their own columns start late)."""

import pytest
import torch
from transformers import LlamaConfig

from trinity.ops.attention import _cascade_attention, _PrefixCache
from trinity.ops.decode_attention import decode_attention

HEADS, KV_HEADS, DIM, WIDTH = 4, 2, 8, 6
CONFIG = LlamaConfig(num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)


def prompts(count: int, gen: torch.Generator):
    """(P, W) left-padded masks (prompt p has W - p real tokens) and their keys/values."""
    mask = torch.ones(count, WIDTH, dtype=torch.bool)
    for p in range(count):
        mask[p, :p] = False
    keys = torch.randn(count, KV_HEADS, WIDTH, DIM, generator=gen)
    values = torch.randn(count, KV_HEADS, WIDTH, DIM, generator=gen)
    return mask, keys, values


def new_cache(source: torch.Tensor, gen: torch.Generator, own: int) -> _PrefixCache:
    mask, keys, values = prompts(int(source.max()) + 1, gen)
    cache = _PrefixCache(CONFIG, mask, source, capacity=4)  # grows past 4: buffers double
    cache.prefix[0] = (keys, values)
    cache.decoding = True
    for _ in range(own):
        write(cache, gen)
    return cache


def write(cache: _PrefixCache, gen: torch.Generator) -> None:
    rows = len(cache.source)
    kv = [torch.randn(rows, KV_HEADS, 1, DIM, generator=gen) for _ in range(2)]
    cache.update(*kv, 0)


def by_definition(cache: _PrefixCache, query: torch.Tensor, scaling: float) -> torch.Tensor:
    """softmax(q . [prompt keys, own keys]) [prompt values, own values], row by row."""
    prefix_k, prefix_v = cache.prefix[0]
    layer = cache.layers[0]
    out = torch.empty_like(query)
    for b, p in enumerate(cache.source.tolist()):
        real = cache.prompt_mask[p]
        first = int(cache.own_start[b])
        keys = torch.cat([prefix_k[p][:, real], layer.keys[b][:, first:]], dim=1)
        values = torch.cat([prefix_v[p][:, real], layer.values[b][:, first:]], dim=1)
        for h in range(HEADS):
            kv = h // (HEADS // KV_HEADS)
            weights = torch.softmax(query[b, h, 0] @ keys[kv].T * scaling, dim=-1)
            out[b, h, 0] = weights @ values[kv]
    return out


@pytest.mark.parametrize("case", ["dense", "rows ended", "rows joined"])
def test_decode_attention_is_attention_over_prompt_and_own_keys(case):
    gen = torch.Generator().manual_seed(0)
    source = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    cache = new_cache(source, gen, own=5)
    if case == "rows ended":
        cache.select_rows(torch.tensor([0, 2, 3, 7, 8]))  # groups of 2, 1 and 2 rows
    if case == "rows joined":
        cache.add(new_cache(torch.tensor([0, 0, 1]), gen, own=0))  # own columns start at 5
        write(cache, gen)
        assert cache.ragged and not cache.dense
    write(cache, gen)  # this step's key/value, as the layer writes them before attending
    query = torch.randn(len(cache.source), HEADS, 1, DIM, generator=gen)
    with torch.no_grad():
        got = decode_attention(cache, 0, query, 0.3)
        merged = _cascade_attention(
            cache, 0, query, cache.layers[0].keys, cache.layers[0].values, 0.3
        )
    expected = by_definition(cache, query, 0.3)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(merged, expected, rtol=1e-5, atol=1e-6)  # the other form agrees
