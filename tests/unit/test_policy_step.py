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
