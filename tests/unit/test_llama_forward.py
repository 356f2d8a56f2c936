"""The engine's own forward for Llama-shaped models (trinity/ops/llama_forward.py): the logits
of transformers' forward through the shared-prefix decoder, at the prefill, at each step, after
rows leave and join, and after the weights change; taken only where it applies."""

import pytest
import torch
from transformers import AutoModelForCausalLM, GemmaConfig, LlamaConfig, MistralConfig, Qwen2Config

from trinity.ops import llama_forward, packed_linear
from trinity.ops.attention import SharedPrefixDecoder

SIZES = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SIZES),
    "qwen2": lambda: Qwen2Config(**SIZES),  # biases on q, k and v
    "mistral": lambda: MistralConfig(**SIZES, sliding_window=None),
}
DTYPES = [d for d in (torch.float32, torch.bfloat16) if packed_linear.available(d)]
pytestmark = pytest.mark.skipif(not DTYPES, reason="this torch build or CPU packs no dtype")


def model_of(config, dtype: torch.dtype = torch.float32, pack: bool = True):
    torch.manual_seed(0)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config).to(dtype).eval()
    for param in model.parameters():  # sharper than the init's 0.02: logits that differ
        param.data.mul_(8.0 if param.dim() > 1 else 1.0)
    if pack:
        packed_linear.pack_linears(model)
    return model


def prompts():
    ids = torch.tensor([[0, 0, 5, 9, 13, 2], [7, 3, 11, 4, 8, 1]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    return ids, mask, torch.tensor([0, 0, 1, 1, 1])


def both(model, ids, mask, source):
    """The same decoder twice: one through the own forward, one through transformers'."""
    own, theirs = (SharedPrefixDecoder(model, ids, mask, source, 8) for _ in range(2))
    assert isinstance(own.own, llama_forward.LlamaForward)
    theirs.own = None
    return own, theirs


# The same bits: the same math in the same dtypes and order; q/k/v (and gate/up) as one oneDNN
# matmul sum each output over the input in the same order as the separate layers do.
SAME = dict(rtol=0, atol=0)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mkl", [False, True], ids=["onednn", "mkl"])
def test_the_own_forward_gives_transformers_logits(kind, dtype, mkl, monkeypatch):
    """Both machine kinds on any machine: fp32 reordered for oneDNN, or plain for MKL."""
    monkeypatch.setattr(packed_linear, "MKL_FP32", mkl)
    model = model_of(CONFIGS[kind](), dtype)
    ids, mask, source = prompts()
    with torch.inference_mode():
        own, theirs = both(model, ids, mask, source)
        torch.testing.assert_close(own.logits, theirs.logits, **SAME)
        tokens = torch.tensor([3, 4, 5, 6, 7])
        for step in range(4):
            if step == 2:  # a row leaves, the rows of another prompt join
                for decoder in (own, theirs):
                    decoder.select(torch.tensor([0, 2, 3, 4]))
                    joined = decoder.join(ids[:1, 2:], mask[:1, 2:], torch.tensor([0, 0]))
                tokens = torch.cat([tokens[[0, 2, 3, 4]], joined.argmax(-1)])
            got, want = own.step(tokens), theirs.step(tokens)
            torch.testing.assert_close(got, want, **SAME)
            assert got.std() > 1  # logits that tell tokens apart
            tokens = want.argmax(-1)


def test_a_weight_written_in_place_is_packed_again():
    model = model_of(CONFIGS["qwen2"]())
    other = model_of(CONFIGS["qwen2"](), pack=False)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn_like(param))
    ids, mask, source = prompts()
    with torch.inference_mode():
        before = both(model, ids, mask, source)[0].logits
    with torch.no_grad():  # as a weight sync writes: copy_ into the model's own tensors
        for mine, theirs in zip(model.parameters(), other.parameters(), strict=True):
            mine.copy_(theirs)
    with torch.inference_mode():
        own, theirs = both(model, ids, mask, source)
        torch.testing.assert_close(own.logits, theirs.logits, **SAME)
        assert not torch.allclose(own.logits, before)
    attention = model.model.layers[0].self_attn
    assert attention._trinity_qkv.weight is not None
    packed_linear.forget(model)  # the engine's release drops the fused copies too
    assert attention._trinity_qkv.weight is None
    assert model.model.layers[0].mlp._trinity_gate_up.weight is None


def test_only_packed_llama_shaped_models_take_it():
    assert llama_forward.supports(model_of(CONFIGS["llama"]()))
    assert not llama_forward.supports(model_of(CONFIGS["llama"](), pack=False))  # a trainer's
    gemma = GemmaConfig(**SIZES, head_dim=16)  # its norm scales by 1 + weight
    assert not llama_forward.supports(model_of(gemma))
    sliding = model_of(MistralConfig(**SIZES, sliding_window=4))
    assert not llama_forward.supports(sliding)
    gelu = model_of(CONFIGS["llama"]())
    gelu.model.layers[1].mlp.act_fn = torch.nn.GELU()
    assert not llama_forward.supports(gelu)


def test_autograd_keeps_transformers_forward(monkeypatch):
    calls = []
    run = llama_forward.LlamaForward.__call__
    monkeypatch.setattr(
        llama_forward.LlamaForward, "__call__", lambda *a, **k: calls.append(1) or run(*a, **k)
    )
    model = model_of(CONFIGS["llama"]())
    ids, mask, source = prompts()
    with torch.no_grad():
        SharedPrefixDecoder(model, ids, mask, source, 8).step(torch.tensor([1, 2, 3, 4, 5]))
    assert len(calls) == 2  # the prefill and the step
    decoder = SharedPrefixDecoder(model, ids, mask, source, 8)
    assert decoder.logits.requires_grad and len(calls) == 2  # transformers' forward
