import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.common.experience import Experience, ExperienceBatch


def test_distill_advantage_is_teacher_minus_student_on_action_tokens():
    exps = [
        Experience(tokens=[1, 2, 3, 4], prompt_length=2, logprobs=[-1.0, -2.0]),
        Experience(tokens=[1, 2, 3], prompt_length=2, logprobs=[-0.5]),
    ]
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    batch.extra["teacher_logprob"] = torch.tensor([[-0.5, -3.0], [-0.5, -9.0]])
    fn = ADVANTAGE_FN.get("on_policy_distill")(kl_coef=2.0)
    batch, metrics = fn(batch)
    # row 0: 2 * (-0.5 - -1.0) = 1.0 and 2 * (-3.0 - -2.0) = -2.0
    # row 1: 2 * (-0.5 - -0.5) = 0.0; its padded column stays 0 whatever the teacher says
    assert batch.advantages.tolist() == [[1.0, -2.0], [0.0, 0.0]]
    # reverse KL estimate: -(0.5 - 1.0 + 0.0) / 3 tokens = 0.5 / 3
    assert metrics["distill/reverse_kl"] == pytest.approx(0.5 / 3)


def test_distill_without_teacher_logprobs_says_how_to_configure():
    batch = ExperienceBatch.from_experiences([Experience(tokens=[1, 2], prompt_length=1)], 0)
    with pytest.raises(ValueError, match="auxiliary_models"):
        ADVANTAGE_FN.get("on_policy_distill")()(batch)
