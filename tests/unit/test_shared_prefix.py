"""Shared-prompt scoring equals the plain forward pass: logprobs and gradients."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.common.experience import Experience, ExperienceBatch
from trinity.trainer import shared_prefix
from trinity.trainer.policy_step import response_logprobs


def _grouped_batch(response_lengths=(3, 1, 4), adjacent: bool = False) -> ExperienceBatch:
    """Prompts of lengths 3, 5 and 4 (so left padding differs), each answered 3 times with
    responses of different lengths (so right padding differs), rows interleaved by group
    (or, ``adjacent``, each group's rows together, as a GRPO step's batch arrives)."""
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16]]
    exps = []
    for sample, length in enumerate(response_lengths):
        for g, prompt in enumerate(prompts):
            response = [20 + (g * 7 + sample * 3 + k) % 30 for k in range(length)]
            exps.append(Experience(tokens=prompt + response, prompt_length=len(prompt)))
    if adjacent:
        exps = [exps[s * len(prompts) + g] for g in range(len(prompts)) for s in range(3)]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def _plain(model, batch):
    """The reference: one forward over every full row."""
    P, R = batch.prompt_len, batch.response_len
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
    ).logits[:, P - 1 : P + R - 1]
    logp = logits.log_softmax(-1)
    return logp.gather(-1, batch.input_ids[:, P:].unsqueeze(-1)).squeeze(-1)


def _loss_and_grads(model, logprob, batch):
    model.zero_grad(set_to_none=True)
    (logprob * batch.action_mask).sum().backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_distinct_prompts_finds_groups_and_first_rows():
    batch = _grouped_batch()
    first, inverse = shared_prefix.distinct_prompts(batch)
    # rows 0,3,6 hold prompt A; 1,4,7 prompt B; 2,5,8 prompt C
    assert sorted(first.tolist()) == [0, 1, 2]
    assert all(inverse[r] == inverse[r % 3] for r in range(9))
    assert len(set(inverse[:3].tolist())) == 3
    # numbered by first appearance: group-major rows map to 0,0,0,1,1,1,2,2,2
    first, inverse = shared_prefix.distinct_prompts(_grouped_batch(adjacent=True))
    assert first.tolist() == [0, 3, 6]
    assert inverse.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("cascade", [True, False])
@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("response_lengths", [(3, 1, 4), (1, 1, 1)])
def test_shared_logprobs_and_gradients_equal_the_plain_pass(
    micro_model, response_lengths, adjacent, cascade, monkeypatch
):
    """Both response passes: the cascade attention, and (for models it does not support)
    the prompt cache copied to every row."""
    if not cascade:
        monkeypatch.setattr(shared_prefix, "supports_shared_prefix", lambda model: False)
    model = AutoModelForCausalLM.from_pretrained(micro_model)
    batch = _grouped_batch(response_lengths, adjacent)
    assert shared_prefix.shared_prefix_logits(model, batch) is not None  # sharing applies
    shared, _ = response_logprobs(model, batch)
    plain = _plain(model, batch)
    mask = batch.action_mask.bool()
    assert torch.allclose(shared[mask], plain[mask], atol=1e-5)
    g_shared = _loss_and_grads(model, response_logprobs(model, batch)[0], batch)
    g_plain = _loss_and_grads(model, _plain(model, batch), batch)
    assert torch.allclose(g_shared, g_plain, atol=1e-5, rtol=1e-4)


def test_no_sharing_without_repeats_or_with_gradient_checkpointing(micro_model):
    model = AutoModelForCausalLM.from_pretrained(micro_model)
    unique = ExperienceBatch.from_experiences(
        [Experience(tokens=[5, 6, 7, 8], prompt_length=2), Experience([9, 7, 8], 1)], 0
    )
    assert shared_prefix.shared_prefix_logits(model, unique) is None
    model.gradient_checkpointing_enable()
    model.train()
    assert shared_prefix.shared_prefix_logits(model, _grouped_batch()) is None
    # the fallback still scores correctly
    batch = _grouped_batch()
    real = batch.attention_mask[:, batch.prompt_len :] > 0  # padding is not scored
    got, want = response_logprobs(model, batch)[0], _plain(model, batch)
    assert torch.allclose(got[real], want[real], atol=1e-5) and not got[~real].any()


def test_one_token_responses_keep_their_batch_columns(micro_model):
    """A micro-batch whose responses are all one token, in the columns of a batch with a
    longer response (the response pass has no token to run)."""
    model = AutoModelForCausalLM.from_pretrained(micro_model)
    batch = _grouped_batch((1, 1, 4)).select(list(range(6)))  # the rows answered with 1 token
    assert batch.response_len == 4
    shared, _ = response_logprobs(model, batch)
    mask = batch.action_mask.bool()
    assert torch.allclose(shared[mask], _plain(model, batch)[mask], atol=1e-5)


@pytest.mark.parametrize("rows", [2, 5])
def test_grouped_query_heads_and_a_lone_group(tmp_path, rows):
    """Grouped-query attention (2 key/value heads for 4 query heads), and a micro-batch
    holding the last rows of one prompt's group, as a split GRPO batch ends: the cascade's
    output was once reshaped with ``view`` over a layout it cannot view."""
    from trinity.demo.tiny import TINY_PRESETS, build_tiny_model

    path = build_tiny_model(str(tmp_path / "gqa"), **TINY_PRESETS["micro"], num_kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = [5, 6, 7, 8]
    exps = [
        Experience(
            tokens=prompt + [20 + (r * 5 + k) % 30 for k in range(6 + r % 3)], prompt_length=4
        )
        for r in range(rows)
    ]
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    assert shared_prefix.shared_prefix_logits(model, batch) is not None
    mask = batch.action_mask.bool()
    assert torch.allclose(
        response_logprobs(model, batch)[0][mask], _plain(model, batch)[mask], atol=1e-5
    )


def _sdpa_ops(fn) -> set:
    """Names of the scaled-dot-product attention ops ``fn()`` ran (forward and backward)."""
    with torch.profiler.profile() as prof:
        fn()
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


def test_short_prompt_passes_to_differentiate_skip_the_flash_kernel(micro_model, monkeypatch):
    """On CPU the shared-prefix pass attends over prompts of up to MATH_BACKWARD_MAX_LEN
    tokens with written-out attention, not torch's flash kernel (its backward is slow there);
    logprobs and gradients equal the flash pass's; a pass without gradients keeps flash."""
    from trinity.ops import attention

    model = AutoModelForCausalLM.from_pretrained(micro_model)
    batch = _grouped_batch((3, 1, 4), adjacent=True)

    def grads():
        return _loss_and_grads(model, response_logprobs(model, batch)[0], batch)

    assert not any("flash" in op for op in _sdpa_ops(grads))
    written_out, g_written_out = response_logprobs(model, batch)[0], grads()
    monkeypatch.setattr(attention, "MATH_BACKWARD_MAX_LEN", 0)
    assert any("flash" in op for op in _sdpa_ops(grads))
    mask = batch.action_mask.bool()
    flash = response_logprobs(model, batch)[0]
    assert torch.allclose(written_out[mask], flash[mask], atol=1e-5)
    assert torch.allclose(grads(), g_written_out, atol=1e-5, rtol=1e-4)
    monkeypatch.setattr(attention, "MATH_BACKWARD_MAX_LEN", 128)
    with torch.no_grad():  # forward only (reference scoring): flash, whatever the length
        assert any("flash" in op for op in _sdpa_ops(lambda: response_logprobs(model, batch)))
