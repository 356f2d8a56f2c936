"""Decoders of the rollout engine: each step's logits equal a plain forward of the whole row."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from trinity.engine.decoding import make_decoder, supports_shared_prefix
from trinity.engine.static_decoding import StaticDecoder, StaticSlots, bucket_rows, static_columns
from trinity.ops import attention

PAD = 0
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def small_llama(kv_heads: int) -> LlamaForCausalLM:
    """Random Llama with sharp logits; ``kv_heads`` < 4 makes it grouped-query attention."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return model


def padded(rows):
    """Left-pad token lists: ids and mask (N, W)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


@torch.no_grad()
def reference_logits(model, rows):
    """Next-token logits of each full row, from one uncached, padded forward."""
    ids, mask = (t.to(model.device) for t in padded(rows))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("shared", [True, False])
def test_decoder_steps_match_full_forward(kv_heads, shared, device, monkeypatch):
    """40 steps from caches with room for 8 new tokens: they double three times, with rows
    dropped before and after a growth."""
    monkeypatch.setattr(attention, "FIRST_CAPACITY", 8)
    model = small_llama(kv_heads).to(device)
    prompts = [[5, 6, 7], [9, 3, 3, 8, 1, 2], [4]]
    # Rows laid out request by request; prompt 0 is asked twice, not adjacently.
    source = torch.tensor([0, 0, 1, 1, 1, 2, 0], device=device)
    ids, mask = (t.to(device) for t in padded(prompts))
    rows = [list(prompts[s]) for s in source.tolist()]
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        decoder = make_decoder(model, ids, mask, source, steps=40, shared=shared)
        # drop rows, leaving groups uneven and one prompt unused
        check_steps(model, decoder, rows, 40, {2: [1, 2, 4, 6], 20: [0, 3]}, gen)


def check_steps(model, decoder, rows, steps, drops, gen, joins=None):
    """Feed random tokens for ``steps`` steps, dropping rows as ``drops`` ({step: keep}) says
    and appending rows of the prompts ``joins`` ({step: (prompts, source)}) says; every
    step's logits must be a full forward's of the rows so far."""
    device = model.device
    logits = decoder.logits
    for step in range(steps):
        if step in (joins or {}):
            prompts, source = joins[step]
            ids, mask = (t.to(device) for t in padded(prompts))
            source = torch.tensor(source, device=device)
            logits = torch.cat([logits, decoder.join(ids, mask, source)])
            rows = rows + [list(prompts[s]) for s in source.tolist()]
        torch.testing.assert_close(logits, reference_logits(model, rows), atol=2e-4, rtol=1e-4)
        if step in drops:
            keep = torch.tensor(drops[step], device=device)
            decoder.select(keep)
            rows = [rows[i] for i in keep.tolist()]
        tokens = torch.randint(1, 40, (len(rows),), generator=gen).to(device)
        for row, tok in zip(rows, tokens.tolist(), strict=True):
            row.append(tok)
        logits = decoder.step(tokens)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("shared", [True, False])
def test_rows_joining_mid_decode_match_full_forward(kv_heads, shared, device, monkeypatch):
    """Rows of new prompts join at steps 2, 9 and 12 (wider and narrower than the running
    ones, one prompt asked again) between drops; what no row reads any more is let go:
    prompts without rows and, once they are half the cache, leading columns."""
    monkeypatch.setattr(attention, "FIRST_CAPACITY", 8)
    model = small_llama(kv_heads).to(device)
    prompts = [[5, 6, 7], [4]]
    source = torch.tensor([0, 1, 0], device=device)
    ids, mask = (t.to(device) for t in padded(prompts))
    rows = [list(prompts[s]) for s in source.tolist()]
    joins = {
        2: ([[9, 3, 3, 8, 1, 2]], [0, 0]),
        9: ([[1, 2, 3, 4, 5, 6, 7, 8, 9], [5, 6, 7]], [0, 1, 0]),
        12: ([[8]], [0]),
    }
    # rows: step 2 -> A A C B B; 5 -> B B; 9 -> B B D A D; 11 -> D A D; 12 -> D A D F;
    # 14 -> A F; 30 -> F
    drops = {5: [3, 4], 11: [2, 3, 4], 14: [1, 3], 30: [1]}
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        decoder = make_decoder(model, ids, mask, source, steps=40, shared=shared)
        check_steps(model, decoder, rows, 40, drops, gen, joins)
    if shared:  # one prompt kept of the 6 asked; own columns from step 9 on (cut at 11)
        assert decoder.cache.groups == 1 and decoder.cache.layers[0].get_seq_length() == 40 - 9
    else:  # 3 + 1 (the wider prompt at step 2) + 40 columns, less 10 no row read at step 14
        assert decoder.columns == 34


@pytest.mark.parametrize(
    "device, graphs",
    [("cpu", False), pytest.param("cuda", False, marks=pytest.mark.gpu)]
    + [pytest.param("cuda", True, marks=pytest.mark.gpu)],
)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_static_decoder_steps_match_full_forward(kv_heads, device, graphs):
    """Fixed buffers (8 rows for 7, 128 columns) reused by a second, narrower batch: every
    step's logits are a full forward's, for running rows only, whatever the finished rows
    (still computed) and the first batch left in the buffers."""
    model = small_llama(kv_heads).to(device)
    slots = StaticSlots(bucket_rows(7), static_columns(6, 40), torch.device(device), graphs)
    assert (slots.rows, slots.columns) == (8, 128)
    gen = torch.Generator().manual_seed(1)
    for prompts, source, drops in (
        (
            [[5, 6, 7], [9, 3, 3, 8, 1, 2], [4]],
            [0, 0, 1, 1, 1, 2, 0],
            {2: [1, 2, 4, 6], 20: [0, 3]},
        ),
        ([[7, 7], [1]], [1, 0, 0], {5: [0, 2]}),
    ):
        source = torch.tensor(source, device=device)
        ids, mask = (t.to(device) for t in padded(prompts))
        rows = [list(prompts[s]) for s in source.tolist()]
        with torch.inference_mode():
            check_steps(model, StaticDecoder(model, ids, mask, source, slots), rows, 40, drops, gen)
    assert (slots.graph is not None) == graphs


def test_static_shapes_are_bucketed():
    assert [bucket_rows(n) for n in (1, 8, 9, 64, 65, 128, 129)] == [8, 8, 16, 64, 128, 128, 256]
    # the last sampled token is never fed back: 100 + 29 columns fit in 128... plus one
    assert static_columns(100, 29) == 128 and static_columns(100, 30) == 256


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_extend_feeds_several_tokens_per_row_causally(kv_heads, device, monkeypatch):
    """``extend`` (the trainer's response pass) gives each new token's logits as a full
    forward of the row up to it would: after a single ``step``, then 3, 20 and 2 tokens at
    a time, growing a cache made with room for 8."""
    monkeypatch.setattr(attention, "FIRST_CAPACITY", 8)
    model = small_llama(kv_heads).to(device)
    prompts = [[5, 6, 7], [9, 3, 3, 8, 1, 2]]
    source = torch.tensor([0, 1, 0, 1, 1], device=device)
    ids, mask = (t.to(device) for t in padded(prompts))
    rows = [list(prompts[s]) for s in source.tolist()]
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        decoder = make_decoder(model, ids, mask, source, steps=26, shared=True)
        first = torch.randint(1, 40, (len(rows),), generator=gen).to(device)
        decoder.step(first)
        rows = [r + [f] for r, f in zip(rows, first.tolist(), strict=True)]
        for width in (3, 20, 2):
            new = torch.randint(1, 40, (len(rows), width), generator=gen).to(device)
            logits = decoder.extend(new)
            for i in range(width):
                upto = [r + n[: i + 1] for r, n in zip(rows, new.tolist(), strict=True)]
                torch.testing.assert_close(
                    logits[:, i], reference_logits(model, upto), atol=2e-4, rtol=1e-4
                )
            rows = [r + n for r, n in zip(rows, new.tolist(), strict=True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_packed_extend_runs_real_tokens_only(kv_heads, device):
    """With ``lengths``, each row's real tokens get the logits of the padded pass; padding
    columns get zeros (and so can never leak into a loss by accident)."""
    model = small_llama(kv_heads).to(device)
    ids, mask = (t.to(device) for t in padded([[5, 6, 7], [9, 3, 3, 8, 1, 2]]))
    source = torch.tensor([0, 0, 1, 1], device=device)
    new = torch.tensor([[21, 22, 23], [24, 0, 0], [27, 28, 0], [30, 31, 32]], device=device)
    lengths = torch.tensor([3, 1, 2, 3], device=device)
    with torch.no_grad():
        padded_pass = make_decoder(model, ids, mask, source, 3, shared=True).extend(new)
        packed = make_decoder(model, ids, mask, source, 3, shared=True).extend(new, lengths)
    real = torch.arange(3, device=device) < lengths[:, None]
    torch.testing.assert_close(packed[real], padded_pass[real], atol=2e-4, rtol=1e-4)
    assert (packed[~real] == 0).all()


def test_shared_prefix_is_used_only_where_the_architecture_allows():
    assert supports_shared_prefix(small_llama(4))
    torch.manual_seed(0)
    sliding = MistralForCausalLM(
        MistralConfig(
            vocab_size=40,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            sliding_window=4,
        )
    )
    assert not supports_shared_prefix(sliding)


def test_model_keeps_plain_attention_outside_the_decoder():
    """The engine's model object also serves ordinary forwards (``generate``, benchmarks)."""
    model = small_llama(2)
    rows = [[5, 6, 7, 8], [1, 2]]
    before = reference_logits(model, rows)
    ids, mask = padded(rows)
    with torch.inference_mode():
        make_decoder(model, ids, mask, torch.tensor([0, 1]), steps=2, shared=True)
    torch.testing.assert_close(reference_logits(model, rows), before)
