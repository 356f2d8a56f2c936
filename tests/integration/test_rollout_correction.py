"""Engine/trainer logprob mismatch and rollout correction in whole GRPO runs (micro model,
2 steps, in this process).

The engine reports each sampled token's logprob under the plain tempered distribution,
before top-k/top-p (trinity/engine/sampling.py), which is what the trainer recomputes; the
mismatch metrics are logged every step without any key.
"""

import json
import os

from tests.integration.conftest import HERE, base_overrides
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")
RC = "algorithm.rollout_correction"


def trainer_records(tmp_path, micro_model, arithmetic_data, *extra: str) -> list:
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "cluster.gpu_per_node=0",  # fp32 on CPU on a GPU machine too: the bounds assume it
        "buffer.total_steps=2",
        "explorer.eval_on_startup=false",
        "explorer.eval_interval=100",
        *extra,
    ]
    (result,) = run(CONFIG, overrides, [])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_engine_and_trainer_score_the_same_support_under_top_p_and_top_k(
    tmp_path, micro_model, arithmetic_data
):
    records = trainer_records(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.taskset.rollout_args.top_p=0.8",
        "buffer.explorer_input.taskset.rollout_args.top_k=5",
    )
    assert [r["step"] for r in records] == [1, 2]
    for r in records:  # logged by default, every step
        # a logprob renormalised over the top-5 tokens would differ by nats, not 1e-4
        assert r["rollout_corr/logprob_abs_diff_max"] < 1e-4, r
        assert abs(r["rollout_corr/k3_kl"]) < 1e-8
        assert abs(r["rollout_corr/kl"]) < 1e-6
        assert abs(r["rollout_corr/ppl_ratio"] - 1.0) < 1e-5
        assert r["training/rollout_probs_diff_max"] < 1e-5
        assert "rollout_corr/rollout_is_mean" not in r  # no correction asked for
    assert abs(records[0]["actor/ppo_kl"]) < 1e-6  # PPO's old logprobs: the engine's


def test_a_bfloat16_engine_is_measured_and_corrected(tmp_path, micro_model, arithmetic_data):
    bf16 = "explorer.rollout_model.dtype=bfloat16"  # the trainer stays in float32
    plain = trainer_records(tmp_path / "plain", micro_model, arithmetic_data, bf16)
    assert all(r["rollout_corr/logprob_abs_diff_max"] > 1e-4 for r in plain)
    assert abs(plain[0]["actor/ppo_kl"]) > 1e-6  # PPO's ratio starts off 1 by the mismatch

    corrected = trainer_records(
        tmp_path / "corrected",
        micro_model,
        arithmetic_data,
        bf16,
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_rs=token",
        f"{RC}.rollout_rs_threshold=1.001",  # tighter than bfloat16's rounding: some go
        f"{RC}.rollout_token_veto_threshold=1e-4",
    )
    assert [r["step"] for r in corrected] == [1, 2]
    for r in corrected:
        assert r["rollout_corr/logprob_abs_diff_max"] > 1e-4
        assert 0.99 < r["rollout_corr/rollout_is_mean"] < 1.01
        assert r["rollout_corr/rollout_is_max"] > 1.0 > r["rollout_corr/rollout_is_min"]
        assert 0.0 < r["rollout_corr/rollout_rs_masked_fraction"] < 1.0
        assert r["rollout_corr/rollout_is_veto_fraction"] == 0.0
        # PPO's old logprobs are the trainer's own now: the first pass's ratio is 1
        assert abs(r["actor/ppo_kl"]) < 1e-6
