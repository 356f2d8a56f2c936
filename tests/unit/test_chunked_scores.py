"""Scores from hidden states, the head applied a chunk of tokens at a time, equal the scores
of the full logits (values and gradients), and keep far less for backward."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from trinity.common.experience import Experience, ExperienceBatch
from trinity.trainer import policy_step, shared_prefix
from trinity.trainer import token_scores as scores
from trinity.trainer.policy_step import output_head, response_logprobs
from trinity.trainer.token_scores import head_scores, token_scores
from trinity.utils.device import compute_in


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=atol)


def _plain(hidden, weight, bias, targets, temperature, with_entropy):
    """The reference: the full logits, then ``token_scores``."""
    return token_scores(
        torch.nn.functional.linear(hidden, weight, bias), targets, temperature, with_entropy
    )


def _random_case(tied: bool):
    """Hidden states (2, 9, 8) of 18 tokens, a vocabulary of 50; ``tied``: the head is an
    embedding's weight that also makes the hidden states (so both gradients meet on it)."""
    torch.manual_seed(0)
    leaf = torch.randn(2, 9, 8, requires_grad=True)
    embedding = torch.nn.Embedding(50, 8)
    targets = torch.randint(0, 50, (2, 9))
    if tied:
        weight, bias = embedding.weight, None
        hidden = leaf + embedding(torch.randint(0, 50, (2, 9)))
    else:
        weight = torch.randn(50, 8, requires_grad=True)
        bias = torch.randn(50, requires_grad=True)
        hidden = leaf * 1.0
    return leaf, hidden, weight, bias, targets


@pytest.mark.parametrize("kept", [0, 8, 18])  # tokens whose logits are kept, not recomputed
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("chunk", [4, 7, 9, 18, 64])  # 18 tokens: divides, not, one, more
@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_head_scores_equal_the_full_logits(
    temperature, with_entropy, chunk, tied, kept, monkeypatch
):
    monkeypatch.setattr(scores, "HEAD_KEEP_ELEMENTS", kept * 50)  # a vocabulary of 50
    leaf, hidden, weight, bias, targets = _random_case(tied)
    up_lp, up_ent = torch.randn(2, 9), torch.randn(2, 9)  # any upstream gradient
    wrt = [t for t in (leaf, weight, bias) if t is not None]
    results = []
    for fn, kwargs in ((_plain, {}), (head_scores, {"chunk_tokens": chunk})):
        logprob, entropy = fn(hidden, weight, bias, targets, temperature, with_entropy, **kwargs)
        loss = (logprob * up_lp).sum() + ((entropy * up_ent).sum() if with_entropy else 0.0)
        results.append((logprob, entropy, torch.autograd.grad(loss, wrt, retain_graph=True)))
    (lp, ent, grads), (lp_c, ent_c, grads_c) = results
    assert lp_c.shape == (2, 9) and lp_c.dtype == torch.float32
    _close(lp_c, lp)
    assert (ent_c is None) == (not with_entropy)
    if with_entropy:
        _close(ent_c, ent)
    for grad_c, grad in zip(grads_c, grads, strict=True):
        _close(grad_c, grad)


def _saved_bytes(fn):
    """(output of ``fn()``, bytes of every tensor autograd saved for backward meanwhile)."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn()
    return out, sum(saved)


@pytest.mark.parametrize("with_entropy", [True, False])
def test_unscored_tokens_cost_nothing_and_score_zero(with_entropy):
    """``scored``: the scored tokens' values and gradients are the full logits' with the
    others' upstream gradients zero; the others get 0 and pass no gradient."""
    leaf, hidden, weight, bias, targets = _random_case(tied=True)
    scored = torch.rand(2, 9, generator=torch.Generator().manual_seed(1)) > 0.4
    assert 0 < int(scored.sum()) < 18
    up_lp, up_ent = torch.randn(2, 9), torch.randn(2, 9)
    results = []
    for kwargs in ({}, {"scored": scored, "chunk_tokens": 4}):
        logprob, entropy = head_scores(hidden, weight, bias, targets, 0.8, with_entropy, **kwargs)
        if not kwargs:  # the reference: every token scored, the others' gradient masked
            logprob, entropy = logprob * scored, entropy * scored if with_entropy else None
        loss = (logprob * up_lp).sum() + ((entropy * up_ent).sum() if with_entropy else 0.0)
        results.append(
            (logprob, entropy, torch.autograd.grad(loss, (leaf, weight), retain_graph=True))
        )
    (lp0, ent0, grads0), (lp1, ent1, grads1) = results
    _close(lp1, lp0)
    assert torch.equal(lp1[~scored], torch.zeros(int((~scored).sum())))
    if with_entropy:
        _close(ent1, ent0)
        assert torch.equal(ent1[~scored], torch.zeros(int((~scored).sum())))
    for got, want in zip(grads1, grads0, strict=True):
        _close(got, want)
    assert torch.equal(grads1[0][~scored], torch.zeros(int((~scored).sum()), 8))


@pytest.mark.parametrize("kept", [False, True])
def test_chunked_scores_save_less_than_the_full_logits(kept, monkeypatch):
    """Recomputing every chunk: a tenth of one fp32 [tokens x vocab] tensor is saved. Keeping
    the chunks' logits (within HEAD_KEEP_ELEMENTS): about one such tensor in the head's
    dtype, a fraction of what the plain path's softmax keeps."""
    monkeypatch.setattr(scores, "HEAD_KEEP_ELEMENTS", 2**27 if kept else 0)
    torch.manual_seed(0)
    tokens, width, vocab = 256, 16, 512
    hidden = torch.randn(1, tokens, width, requires_grad=True)
    weight = (torch.randn(vocab, width) / width**0.5).requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens))
    logits_bytes = tokens * vocab * 4  # one fp32 [tokens x vocab] tensor
    args = (hidden, weight, None, targets, 0.7, True)
    plain, plain_bytes = _saved_bytes(lambda: _plain(*args))
    chunked, chunked_bytes = _saved_bytes(lambda: head_scores(*args, chunk_tokens=32))
    assert plain_bytes > 2 * logits_bytes  # the plain path keeps its softmax tensors
    if kept:  # the logits, hidden states, head weight and a few numbers per token
        assert logits_bytes < chunked_bytes < 1.2 * logits_bytes
    else:  # hidden states, head weight and a few numbers per token: a tenth of the logits
        assert chunked_bytes < logits_bytes / 8
    expected = torch.autograd.grad(plain[0].sum() + plain[1].sum(), (hidden, weight))
    got = torch.autograd.grad(chunked[0].sum() + chunked[1].sum(), (hidden, weight))
    for grad_c, grad in zip(got, expected, strict=True):
        _close(grad_c, grad)


def _grouped_batch() -> ExperienceBatch:
    """Three prompts (lengths 3, 5, 4: left padding differs), each answered three times
    with responses of lengths 3, 1 and 4 (right padding differs), groups together."""
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16]]
    exps = [
        Experience(
            tokens=prompt + [20 + (g * 7 + s * 3 + k) % 30 for k in range(length)],
            prompt_length=len(prompt),
        )
        for g, prompt in enumerate(prompts)
        for s, length in enumerate((3, 1, 4))
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def _scores_and_grads(model, batch, temperature, with_entropy, share_prefix):
    model.zero_grad(set_to_none=True)
    logprob, entropy = response_logprobs(model, batch, temperature, with_entropy, share_prefix)
    torch.manual_seed(1)
    mask = batch.action_mask.float()
    loss = (logprob * mask * torch.randn(mask.shape)).sum()
    if with_entropy:
        loss = loss + (entropy * mask * torch.randn(mask.shape)).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprob.detach(), None if entropy is None else entropy.detach(), grads


def _assert_chunked_equals_full(monkeypatch, model, batch, temperature, with_entropy, share):
    """response_logprobs through the chunked head equals the full-logits path's."""
    vocab = model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(scores, "HEAD_CHUNK_ELEMENTS", 5 * vocab)  # 5 tokens a chunk
    assert output_head(model) is not None
    chunked = _scores_and_grads(model, batch, temperature, with_entropy, share)
    with monkeypatch.context() as patch:
        patch.setattr(policy_step, "PLAIN_HEAD_MODELS", frozenset())  # the full logits
        assert output_head(model) is None
        full = _scores_and_grads(model, batch, temperature, with_entropy, share)
    # the response's padding is not scored through the head: 0 there
    real = batch.attention_mask[:, batch.prompt_len :] > 0
    assert not real.all()
    for got, want in zip(chunked[:2] if with_entropy else chunked[:1], full, strict=False):
        _close(got[real], want[real])
        assert not got[~real].any()
    assert chunked[2].keys() == full[2].keys() and full[2]
    for name, grad in full[2].items():
        _close(chunked[2][name], grad)


@pytest.mark.parametrize("path", ["plain", "cascade", "copied-cache"])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_micro_model_scores_and_gradients_equal_the_full_logits(
    micro_model, monkeypatch, path, with_entropy
):
    model = AutoModelForCausalLM.from_pretrained(micro_model)
    # tied embeddings: the head's gradient and the embedding's are one, both must land
    assert model.lm_head.weight is model.model.embed_tokens.weight
    batch = _grouped_batch()
    if path == "copied-cache":
        monkeypatch.setattr(shared_prefix, "_CASCADE_SCORES", 0)
    if path != "plain":
        assert shared_prefix.shared_prefix_logits(model, batch) is not None
    share = path != "plain"
    _assert_chunked_equals_full(monkeypatch, model, batch, 0.8, with_entropy, share)


def _tiny_config(model_type: str):
    return AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=False,
    )


@pytest.mark.parametrize("model_type", sorted(policy_step.PLAIN_HEAD_MODELS))
def test_every_plain_head_architecture_equals_its_full_logits(monkeypatch, model_type):
    """Each architecture scored through its head is checked here (untied heads)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_tiny_config(model_type))
    assert model.config.model_type == model_type
    _assert_chunked_equals_full(monkeypatch, model, _grouped_batch(), 1.3, True, False)


def test_bf16_compute_scores_agree_with_the_full_logits(micro_model, monkeypatch):
    """Under compute_in's autocast the decoder and the head product both run in bf16."""
    model = compute_in(AutoModelForCausalLM.from_pretrained(micro_model), torch.bfloat16)
    batch = _grouped_batch()
    chunked = _scores_and_grads(model, batch, 0.8, True, False)
    monkeypatch.setattr(policy_step, "PLAIN_HEAD_MODELS", frozenset())
    full = _scores_and_grads(model, batch, 0.8, True, False)
    real = batch.attention_mask[:, batch.prompt_len :] > 0  # padding: 0 through the head
    _close(chunked[0][real], full[0][real], atol=1e-2)
    _close(chunked[1][real], full[1][real], atol=1e-2)
    flat = [torch.cat([g.flatten() for g in grads.values()]) for grads in (chunked[2], full[2])]
    assert torch.nn.functional.cosine_similarity(*flat, dim=0) > 0.999
    fp32 = _scores_and_grads(
        AutoModelForCausalLM.from_pretrained(micro_model), batch, 0.8, True, False
    )
    assert not torch.equal(chunked[0], fp32[0])  # bf16 compute did happen


def test_fallbacks_where_logits_are_not_the_plain_head(micro_model):
    model = AutoModelForCausalLM.from_pretrained(micro_model)
    decoder, head = output_head(model)
    assert decoder is model.model and head is model.lm_head
    model.config.final_logit_softcapping = 30.0  # Gemma 2 style: tanh-capped logits
    assert output_head(model) is None
    model.config.final_logit_softcapping = None
    model.lm_head = torch.nn.Sequential(model.lm_head)  # a head with a forward of its own
    assert output_head(model) is None
    gpt2 = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gpt2", n_embd=16, n_layer=1, n_head=2, vocab_size=64)
    )
    assert output_head(gpt2) is None  # an architecture not checked here


def test_lora_adapters_train_through_the_chunked_head(micro_model, monkeypatch):
    """peft injects LoRA into the base model's modules: the decoder call runs them, and
    only the adapters' gradients exist. An adapter on the head itself falls back."""
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(micro_model)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    lora = get_peft_model(model, config)
    decoder, head = output_head(lora)
    assert decoder is lora.get_base_model().model and head is lora.get_base_model().lm_head
    _assert_chunked_equals_full(monkeypatch, lora, _grouped_batch(), 0.8, True, True)
    on_head = LoraConfig(r=4, target_modules=["lm_head"])
    assert (
        output_head(get_peft_model(AutoModelForCausalLM.from_pretrained(micro_model), on_head))
        is None
    )
