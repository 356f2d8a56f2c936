import pytest
import torch

from trinity.common.experience import Experience, ExperienceBatch


def test_experience_validates_lengths():
    with pytest.raises(ValueError, match="logprobs has length 1"):
        Experience(tokens=[1, 2, 3], prompt_length=1, logprobs=[0.0])
    with pytest.raises(ValueError, match="exceeds"):
        Experience(tokens=[1], prompt_length=2)


def test_batch_layout_left_pads_prompt_and_right_pads_response():
    a = Experience(tokens=[5, 6, 7, 8], prompt_length=2, logprobs=[-0.1, -0.2], reward=1.0)
    b = Experience(tokens=[9, 10, 11], prompt_length=1, logprobs=[-0.3, -0.4], reward=0.0)
    batch = ExperienceBatch.from_experiences([a, b], pad_token_id=0)
    # P = 2 prompt columns, R = 2 response columns.
    assert batch.prompt_len == 2 and batch.response_len == 2
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [0, 9, 10, 11]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]
    assert torch.allclose(batch.old_logprob, torch.tensor([[-0.1, -0.2], [-0.3, -0.4]]))
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.tensor("logprobs") is batch.old_logprob


def test_batch_masks_short_responses_and_selects_rows():
    a = Experience(tokens=[1, 2, 3, 4], prompt_length=1)
    b = Experience(tokens=[1, 2], prompt_length=1)
    batch = ExperienceBatch.from_experiences([a, b], pad_token_id=0)
    assert batch.action_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    sub = batch.select([1])
    assert sub.input_ids.tolist() == [[1, 2, 0, 0]] and sub.experiences == [b]


def test_pickling_keeps_tensors_dtypes_and_writability():
    import pickle

    exp = Experience(tokens=[1, 2, 3], prompt_length=1, logprobs=[-0.1, -0.2])
    exp.advantages = torch.tensor([0.5, 1.5], dtype=torch.bfloat16)  # numpy has no bf16
    exp.info["ids"] = torch.tensor([7])  # inside info: pickled as it is
    copy = pickle.loads(pickle.dumps(exp))
    for name in ("tokens", "logprobs", "action_mask", "advantages"):
        a, b = getattr(exp, name), getattr(copy, name)
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(copy.info["ids"], exp.info["ids"])
    copy.tokens[0] = 9  # a tensor the receiver owns
    assert exp.tokens[0] == 1
