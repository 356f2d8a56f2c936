"""ExperienceBatch read and written as veRL's DataProto, and a veRL-style advantage fn
run through the trainer's advantage path."""

import json
import textwrap
from collections import defaultdict
from typing import Dict, Tuple

import numpy as np
import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN, AdvantageFn
from trinity.algorithm.advantage_fn import GRPOAdvantageFn
from trinity.common.config import load_config
from trinity.common.experience import Experience, ExperienceBatch
from trinity.preflight.derive import finalize


def make_batch() -> ExperienceBatch:
    """Rows of prompt length 2, 1, 2 and responses of length 2, 3, 1: P = 2, R = 3."""
    exps = [
        Experience(tokens=[5, 6, 7, 8], prompt_length=2, reward=1.0, logprobs=[-0.1, -0.2]),
        Experience(tokens=[9, 10, 11, 12], prompt_length=1, reward=0.0, action_mask=[1, 0, 1]),
        Experience(tokens=[13, 14, 15], prompt_length=2, reward=2.0),
    ]
    for e, g in zip(exps, ["a", "b", "a"], strict=True):
        e.group_id = g
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def test_tensors_under_verl_names_share_storage():
    data = make_batch()
    view = data.batch
    assert len(data) == 3 and view.batch_size == torch.Size([3])
    assert view["input_ids"] is data.input_ids
    assert view["attention_mask"] is data.attention_mask
    assert view["position_ids"] is data.position_ids
    assert view["response_mask"] is data.action_mask
    assert view["old_log_probs"] is data.old_logprob
    # prompts / responses are views of input_ids, veRL's left/right padded halves
    assert torch.equal(view["prompts"], torch.tensor([[5, 6], [0, 9], [13, 14]]))
    assert torch.equal(view["responses"], torch.tensor([[7, 8, 0], [10, 11, 12], [15, 0, 0]]))
    assert view["responses"].data_ptr() == data.input_ids[:, 2:].data_ptr()
    view["responses"][0, 0] = 99  # in place: the row itself changes
    assert data.input_ids[0, 2] == 99
    # the response part of attention_mask, as veRL's compute_response_mask reads it
    assert torch.equal(
        view["attention_mask"][:, -3:], torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    )


def test_scores_and_rewards_are_the_reward_on_the_last_action_token():
    data = make_batch()
    assert "token_level_scores" in data.batch and "advantages" not in data.batch
    scores = data.batch["token_level_scores"]
    # row 1's last action token is column 2 (column 1 is an environment token)
    assert torch.equal(scores, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0, 0]]))
    assert data.batch["token_level_scores"] is scores  # stored: later reads share it
    rewards = data.batch["token_level_rewards"]
    assert rewards is data.token_level_rewards and torch.equal(rewards, scores)
    rewards[2, 0] = 5.0  # in-place edits reach the batch, and not the scores
    assert data.token_level_rewards[2, 0] == 5.0 and scores[2, 0] == 2.0


def test_writes_set_the_batch_fields():
    data = make_batch()
    adv = torch.arange(9.0).reshape(3, 3)
    data.batch["advantages"] = adv
    data.batch["returns"] = adv * 2
    data.batch["ref_log_prob"] = torch.zeros(3, 3)
    data.batch["values"] = torch.ones(3, 3)
    data.batch["my_tensor"] = torch.ones(3)
    assert data.advantages is adv and torch.equal(data.returns, adv * 2)
    assert data.ref_logprob is not None and torch.equal(data.extra["values"], torch.ones(3, 3))
    assert data.tensor("my_tensor").shape == (3,)  # a loss fn can ask for it by name
    assert {"advantages", "returns", "ref_log_prob", "values", "my_tensor"} <= set(data.batch)
    del data.batch["returns"]
    assert data.returns is None
    with pytest.raises(ValueError, match=r"batch\['advantages'\] must have shape \(3, 3\)"):
        data.batch["advantages"] = torch.zeros(3, 4)
    with pytest.raises(KeyError, match="cannot be removed"):
        del data.batch["response_mask"]
    with pytest.raises(KeyError, match="no tensor 'missing'"):
        data.batch["missing"]


def test_uid_and_meta_info():
    data = make_batch()
    uid = data.non_tensor_batch["uid"]
    assert isinstance(uid, np.ndarray) and uid.dtype == object and list(uid) == ["a", "b", "a"]
    data.non_tensor_batch["uid"] = np.array(["x", "y", "y"], dtype=object)
    assert data.group_ids == ["x", "y", "y"]
    data.non_tensor_batch["data_source"] = ["s0", "s1", "s2"]
    data.meta_info["temperature"] = 1.0
    sub = data.select([2, 0])
    assert list(sub.non_tensor_batch["uid"]) == ["y", "x"]
    assert list(sub.non_tensor_batch["data_source"]) == ["s2", "s0"]
    assert sub.meta_info == {"temperature": 1.0}
    with pytest.raises(ValueError, match="one entry per row"):
        data.non_tensor_batch["uid"] = ["only-one"]


class VerlGRPOAdvantage(AdvantageFn):
    """GRPO's outcome advantage as veRL computes it, written against DataProto only."""

    needs_groups = True

    def __init__(self, epsilon: float = 1e-6) -> None:
        self.epsilon = epsilon

    def __call__(self, data, **kwargs) -> Tuple[object, Dict]:
        token_level_rewards = data.batch["token_level_rewards"]
        response_mask = data.batch["response_mask"]
        index = data.non_tensor_batch["uid"]
        scores = token_level_rewards.sum(dim=-1)
        id2score = defaultdict(list)
        for i in range(len(data)):
            id2score[index[i]].append(scores[i])
        id2mean, id2std = {}, {}
        for idx, group in id2score.items():
            if len(group) == 1:  # veRL: a lone response keeps its raw score
                id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
            else:
                id2mean[idx], id2std[idx] = (
                    torch.mean(torch.stack(group)),
                    torch.std(torch.stack(group)),
                )
        for i in range(len(data)):
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + self.epsilon)
        advantages = scores.unsqueeze(-1) * response_mask
        data.batch["advantages"] = advantages
        data.batch["returns"] = advantages
        return data, {}

    @classmethod
    def default_args(cls) -> Dict:
        return {"epsilon": 1e-6}


CONFIG = """
project: tests
name: plugin
checkpoint_root_dir: {root}
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 4}}
algorithm: {algorithm}
buffer:
  batch_size: 2
  total_steps: 1
  explorer_input:
    default_workflow_type: math_workflow
    taskset: {{name: train, path: {data}, split: train,
               format: {{prompt_key: question, response_key: answer}}}}
"""


def make_trainer(tmp_path, micro_model, arithmetic_data, algorithm: Dict):
    """A prepared ``Trainer`` on the micro model whose config's ``algorithm`` is
    ``algorithm`` (it reads no experiences: call ``train_step`` or its parts)."""
    from trinity.trainer.trainer import Trainer

    path = tmp_path / "config.yaml"
    text = CONFIG.format(
        root=tmp_path,
        model=micro_model,
        data=arithmetic_data["rl"],
        algorithm=json.dumps(algorithm),
    )
    path.write_text(textwrap.dedent(text))
    config = finalize(load_config(str(path)))
    trainer = Trainer(config, planned_steps=1, log=lambda metrics, step: None)
    trainer.prepare_model()
    return trainer


@pytest.fixture
def trainer(tmp_path, micro_model, arithmetic_data, monkeypatch):
    monkeypatch.setattr(ADVANTAGE_FN, "_modules", dict(ADVANTAGE_FN._modules))
    ADVANTAGE_FN.register_module("verl_grpo", VerlGRPOAdvantage)
    algorithm = {"algorithm_type": "grpo", "repeat_times": 4, "advantage_fn": "verl_grpo"}
    return make_trainer(tmp_path, micro_model, arithmetic_data, algorithm)


# Two groups of four in an irregular order (so a wrong grouping cannot look right), with
# distinct rewards and response lengths.
ORDER = [("g0", 1.0), ("g0", 0.0), ("g1", 3.0), ("g0", 0.0)]
ORDER += [("g1", 1.0), ("g1", 2.0), ("g0", 1.0), ("g1", 0.0)]
G1_ROWS = [2, 4, 5, 7]


def group_experiences(tokenizer):
    exps = []
    for k, (group, reward) in enumerate(ORDER):
        prompt = tokenizer.encode(f"1+{group[1]}=")
        response = tokenizer.encode(str(10**k))[: 1 + k % 3]
        exps.append(
            Experience(
                tokens=prompt + response,
                prompt_length=len(prompt),
                reward=reward,
                logprobs=[-0.5] * len(response),
                group_id=group,
            )
        )
    return exps


def test_verl_style_grpo_equals_builtin_through_the_trainer(trainer):
    assert isinstance(trainer.advantage_fn, VerlGRPOAdvantage)
    exps = group_experiences(trainer.tokenizer)
    ported = trainer._batch(exps)
    trainer._prepare_batch(ported)
    trainer.advantage_fn = GRPOAdvantageFn(**GRPOAdvantageFn.default_args())
    builtin = trainer._batch(exps)
    trainer._prepare_batch(builtin)
    assert torch.allclose(ported.advantages, builtin.advantages, atol=1e-6)
    assert torch.allclose(ported.returns, builtin.returns, atol=1e-6)
    # Hand check, group g1 (rewards 3, 1, 2, 0): mean 1.5, unbiased std sqrt(5/3).
    std = (5.0 / 3.0) ** 0.5
    firsts = ported.advantages[G1_ROWS, 0]
    expected = torch.tensor([1.5, -0.5, 0.5, -1.5]) / (std + 1e-6)
    assert torch.allclose(firsts, expected, atol=1e-5)


def test_verl_style_fn_trains_a_step(trainer):
    metrics = trainer.train_step(group_experiences(trainer.tokenizer))
    assert np.isfinite(metrics["actor/grad_norm"])
    assert metrics["critic/advantages/max"] > 0 > metrics["critic/advantages/min"]
