"""The trainer's step: logprob alignment, micro-batching, gradient accumulation."""

import torch
from transformers import AutoModelForCausalLM

from trinity.algorithm import ENTROPY_LOSS_FN, KL_FN, POLICY_LOSS_FN
from trinity.common.experience import Experience, ExperienceBatch
from trinity.trainer.policy_step import (
    LossFns,
    accumulate_gradients,
    micro_batches,
    response_logprobs,
)


def _batch(n: int = 6) -> ExperienceBatch:
    exps = [
        Experience(tokens=list(range(5, 12 + i % 3)), prompt_length=3 + i % 2, reward=float(i % 2))
        for i in range(n)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def test_micro_batches_by_rows_tokens_and_multiples():
    batch = _batch(6)
    T = batch.input_ids.shape[1]
    assert [len(m) for m in micro_batches(batch, 4)] == [4, 2]
    assert [len(m) for m in micro_batches(batch, 1, max_tokens=3 * T)] == [3, 3]
    assert [len(m) for m in micro_batches(batch, 3, multiple=2)] == [2, 2, 2]  # pairs kept
    assert micro_batches(batch, 100)[0] is batch


def test_response_logprobs_match_a_manual_forward(micro_model):
    model = AutoModelForCausalLM.from_pretrained(micro_model)
    exp = Experience(tokens=[5, 6, 7, 8, 9], prompt_length=2)
    batch = ExperienceBatch.from_experiences(
        [exp, Experience(tokens=[5, 6, 7], prompt_length=1)], 0
    )
    logprob, entropy = response_logprobs(model, batch)
    logits = model(torch.tensor([[5, 6, 7, 8, 9]])).logits[0].log_softmax(-1)
    # response tokens 7, 8, 9 are predicted by positions 1, 2, 3
    expected = torch.stack([logits[1, 7], logits[2, 8], logits[3, 9]])
    assert torch.allclose(logprob[0], expected, atol=1e-5)
    assert entropy.shape == logprob.shape


def test_micro_batched_gradient_equals_full_batch(micro_model):
    fns = LossFns(POLICY_LOSS_FN.get("sft")(), KL_FN.get("none")(), ENTROPY_LOSS_FN.get("none")())
    batch = _batch(6)
    grads = []
    for size in (6, 2):
        model = AutoModelForCausalLM.from_pretrained(micro_model)
        accumulate_gradients(model, batch, fns, size)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_token_scores_in_chunks_equal_one_pass(monkeypatch):
    import trinity.trainer.policy_step as policy_step
    import trinity.trainer.token_scores as token_scores

    torch.manual_seed(0)
    logits = torch.randn(5, 4, 11, requires_grad=True)
    targets = torch.randint(0, 11, (5, 4))
    whole = policy_step.token_scores(logits, targets, temperature=0.7)
    # by hand: log p(target) and -sum p log p of softmax(logits / T)
    log_p = (logits.detach() / 0.7).log_softmax(-1)
    assert torch.allclose(whole[0], log_p.gather(-1, targets[..., None])[..., 0], atol=1e-6)
    assert torch.allclose(whole[1], -(log_p.exp() * log_p).sum(-1), atol=1e-6)
    (whole[0].sum() + whole[1].sum()).backward()
    expected_grad, logits.grad = logits.grad.clone(), None
    monkeypatch.setattr(token_scores, "CHUNK_ELEMENTS", 2 * 4 * 11)  # chunks of 2, 2 and 1 rows
    chunked = policy_step.token_scores(logits, targets, temperature=0.7)
    (chunked[0].sum() + chunked[1].sum()).backward()
    assert torch.allclose(chunked[0], whole[0]) and torch.allclose(chunked[1], whole[1])
    assert torch.allclose(logits.grad, expected_grad, atol=1e-6)
    with torch.no_grad():  # scoring only (reference model): chunks, nothing to recompute
        assert torch.allclose(policy_step.token_scores(logits, targets, 0.7, False)[0], whole[0])


def test_bf16_compute_over_fp32_weights_matches_the_fp32_step(micro_model):
    """fsdp_config.mixed_precision.param_dtype: bf16 — CPU autocast runs the same code a GPU
    runs; weights and gradients stay fp32 and the step agrees with the fp32 one closely."""
    from trinity.utils.device import compute_in

    fns = LossFns(POLICY_LOSS_FN.get("sft")(), KL_FN.get("none")(), ENTROPY_LOSS_FN.get("none")())
    batch = _batch(6)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        model = compute_in(AutoModelForCausalLM.from_pretrained(micro_model), dtype)
        metrics = accumulate_gradients(model, batch, fns, 6)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert grads.dtype == torch.float32
        results.append((metrics["sft_loss"], grads, response_logprobs(model, batch)[0]))
    (loss32, grad32, lp32), (loss16, grad16, lp16) = results
    assert not torch.equal(lp32, lp16)  # bf16 compute did happen
    # bf16 keeps 8 bits of mantissa: logprobs within 0.05, the update's direction kept
    assert (lp32 - lp16).abs().max() < 0.05
    assert abs(loss32 - loss16) < 0.02 * abs(loss32)
    assert torch.nn.functional.cosine_similarity(grad32, grad16, dim=0) > 0.99
