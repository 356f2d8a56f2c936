"""What the trainer hands to losses beyond the micro-batch: M2PO's whole-batch mask, the step."""

import pytest
import torch

from tests.unit.test_dataproto_view import group_experiences, make_trainer


@pytest.fixture
def m2po_trainer(tmp_path, micro_model, arithmetic_data):
    algorithm = {"algorithm_type": "m2po", "repeat_times": 4}  # m2_threshold 0.04
    return make_trainer(tmp_path, micro_model, arithmetic_data, algorithm)


def test_m2po_loss_sees_the_mask_of_the_whole_batch(m2po_trainer):
    trainer = m2po_trainer
    trainer.settings["micro_batch_size_per_device"] = 4  # rows 0-3, then rows 4-7
    exps = group_experiences(trainer.tokenizer)
    # Old logprobs set so each row's log r is a constant d (the model's own logprob - d).
    # GRPO's signs on these groups: A > 0 on rows 0, 2, 5, 6, so every token is in the trust
    # region's reach; response lengths 1, 2, 3, 1, 2, 3, 1, 2 (15 tokens).
    current = trainer._score(trainer.model, trainer._batch(exps))
    shift = [0.1, -0.1, 0.1, -0.1, -0.5, 0.5, 0.1, -0.1]
    for row, (exp, d) in enumerate(zip(exps, shift, strict=True)):
        exp.logprobs = current[row, : len(exp.logprobs)] - d
    # Whole batch: ten tokens with (log r)^2 = 0.01 and five with 0.25; the ten and one 0.25
    # average (0.1 + 0.25) / 11 = 0.032 <= 0.04, a second would make 0.6 / 12 = 0.05: 4 of
    # the 15 tokens masked. Per micro-batch, rows 0-3 (all 0.01) would mask none and rows 4-7
    # (three 0.01, five 0.25: (0.03 + 0.25) / 4 = 0.07) all five: 5 of 15.
    metrics = trainer.train_step(exps)
    assert metrics["actor/m2po_masked_frac"] == pytest.approx(4 / 15, abs=1e-6)


def test_every_row_carries_the_step_being_trained(m2po_trainer):
    m2po_trainer.step = 3
    batch = m2po_trainer._batch(group_experiences(m2po_trainer.tokenizer))
    assert torch.equal(batch.extra["step"], torch.full((8,), 3.0))
