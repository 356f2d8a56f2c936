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


def test_batch_to_a_device_moves_every_tensor():
    import torch

    from trinity.common.experience import Experience, ExperienceBatch

    exps = [Experience(tokens=[1, 2, 3, 4], prompt_length=2, reward=1.0) for _ in range(2)]
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    assert batch.to("cpu") is batch  # already there: no copy
    batch.advantages = torch.ones(2, 2)
    batch.extra["expert_mask"] = torch.zeros(2)
    moved = batch.to("meta")  # a device without memory stands in for a GPU
    tensors = [moved.input_ids, moved.attention_mask, moved.action_mask, moved.rewards]
    tensors += [moved.old_logprob, moved.advantages, moved.extra["expert_mask"]]
    assert {t.device.type for t in tensors} == {"meta"}
    assert moved.returns is None and moved.group_ids == batch.group_ids
    assert batch.input_ids.device.type == "cpu"  # the original stays
    assert moved.select([1]).input_ids.device.type == "meta"
