"""Every algorithm type runs a short real run on the micro model: finite losses, new weights."""

import math
import os

import pytest

from tests.integration.conftest import HERE, base_overrides
from tests.integration.test_run import CONFIG, records, weights_changed
from trinity.demo.synthetic import write_jsonl
from trinity.runtime.launcher import run

PLUGINS = os.path.join(HERE, "plugins")

# algorithm type -> extra overrides (repeat_times and the like that make a 2-step run meaningful)
RL_TYPES = {
    "grpo": [],
    "ppo": ["algorithm.repeat_times=1"],
    "opmd": [],
    "rloo": [],
    "reinforceplusplus": ["algorithm.repeat_times=1"],
    "remax": [
        "algorithm.repeat_times=1",
        "buffer.explorer_input.taskset.workflow_args={greedy_baseline: true}",
    ],
    "dapo": ["algorithm.repeat_times=4"],
    "drgrpo": ["algorithm.repeat_times=4"],
    "gspo": ["algorithm.repeat_times=4"],
    "cispo": ["algorithm.repeat_times=4"],
    "rec": ["algorithm.repeat_times=4"],
    "sppo": ["algorithm.repeat_times=4"],
    "sapo": ["algorithm.repeat_times=4"],
    "m2po": ["algorithm.repeat_times=4"],
}


def _finite_losses(job_dir: str) -> list:
    trainer = records(job_dir, "trainer")
    losses = [v for r in trainer for k, v in r.items() if k.endswith("_loss")]
    assert losses and all(v is not None and math.isfinite(v) for v in losses)
    return trainer


def _rl_overrides(tmp_path, micro_model, data, name, extra):
    return base_overrides(tmp_path, micro_model, data) + [
        f"algorithm.algorithm_type={name}",
        "buffer.explorer_input.default_reward_fn_type=parity_reward",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
        "model.max_response_tokens=6",
        *extra,
    ]


@pytest.mark.parametrize("name", sorted(RL_TYPES))
def test_rl_algorithm_trains(name, tmp_path, micro_model, arithmetic_data, ray_cluster):
    overrides = _rl_overrides(tmp_path, micro_model, arithmetic_data, name, RL_TYPES[name])
    (result,) = run(CONFIG, overrides, [PLUGINS])
    trainer = _finite_losses(result.job_dir)
    assert [r["step"] for r in trainer] == [1, 2]
    assert weights_changed(micro_model, result.final_hf)
    if name == "ppo":
        assert all("critic/vf_loss" in r for r in trainer)
        assert os.path.exists(os.path.join(result.job_dir, "global_step_2", "critic.pt"))


@pytest.mark.parametrize("name, sft_metric", [("mix", "sft_loss"), ("mix_chord", "sft_phi_loss")])
def test_mix_trains_on_rl_and_expert_data(
    name, sft_metric, tmp_path, micro_model, arithmetic_data, ray_cluster
):
    sft = arithmetic_data["sft"]
    overrides = _rl_overrides(tmp_path, micro_model, arithmetic_data, name, [])
    overrides += [
        "algorithm.repeat_times=4",
        "buffer.trainer_input.auxiliary_buffers={sft_dataset: {name: sft_dataset, storage_type:"
        f" file, path: {sft}, format: {{prompt_key: prompt, response_key: response}}}}}}",
    ]
    if name == "mix_chord":  # mu decays from 0.9 over the 2 steps: 0.9, then 0.05
        overrides += ["algorithm.policy_loss_fn_args={mu_peak: 0.9, mu_valley: 0.05, "
                      "mu_decay_steps: 1}"]  # fmt: skip
    (result,) = run(CONFIG, overrides, [PLUGINS])
    trainer = _finite_losses(result.job_dir)
    assert all(r["sample/expert_count"] > 0 for r in trainer)
    assert all(f"actor/expert/{sft_metric}" in r for r in trainer)
    if name == "mix_chord":
        assert [r["actor/mu"] for r in trainer] == pytest.approx([0.9, 0.05])
    assert weights_changed(micro_model, result.final_hf)


def dpo_data(root) -> str:
    rows = [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
        for a in range(6)
        for b in range(6)
    ]
    write_jsonl(os.path.join(root, "dpo", "train.jsonl"), rows)
    return os.path.join(root, "dpo")


def test_dpo_trains_on_pairs(tmp_path, micro_model, arithmetic_data, ray_cluster):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "mode=train",
        "algorithm.algorithm_type=dpo",
        "buffer.train_batch_size=8",
        "buffer.total_steps=2",
        "buffer.trainer_input.experience_buffer={name: pairs, storage_type: file,"
        f" path: {dpo_data(tmp_path)}, format: {{prompt_key: prompt, chosen_key: chosen,"
        " rejected_key: rejected}}",
    ]
    (result,) = run(CONFIG, overrides, [])
    trainer = _finite_losses(result.job_dir)
    assert [r["step"] for r in trainer] == [1, 2]
    assert all("actor/reward_accuracy" in r for r in trainer)
    assert weights_changed(micro_model, result.final_hf)


def test_guide_opmd_example_as_plugin(tmp_path, micro_model, arithmetic_data, ray_cluster):
    """spec/developer-guide.txt's OPMD AdvantageFn/PolicyLossFn/AlgorithmType, as a plugin."""
    from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE, POLICY_LOSS_FN

    builtins = {r: r.get("opmd") for r in (ADVANTAGE_FN, POLICY_LOSS_FN, ALGORITHM_TYPE)}
    overrides = _rl_overrides(tmp_path, micro_model, arithmetic_data, "opmd", [])
    try:
        (result,) = run(CONFIG, overrides, [PLUGINS, os.path.join(HERE, "plugins_opmd")])
        assert ALGORITHM_TYPE.get("opmd").__module__.startswith("trinity_plugin_")
    finally:
        for registry, cls in builtins.items():
            registry._modules["opmd"] = cls
    trainer = _finite_losses(result.job_dir)
    assert all("actor/opmd_loss" in r and "opmd/advantage_abs_mean" in r for r in trainer)
    assert weights_changed(micro_model, result.final_hf)
    with open(os.path.join(result.job_dir, "config.yaml")) as f:
        assert "sample_strategy: warmup" in f.read()


@pytest.mark.parametrize("name, divergence", [("on_policy_distill", "reverse_kl"), ("jsd", "jsd")])
def test_distill_from_a_teacher(
    name, divergence, tmp_path, micro_model, arithmetic_data, ray_cluster
):
    from trinity.demo.tiny import build_tiny_preset

    teacher = build_tiny_preset(str(tmp_path / "teacher"), "micro", seed=1)
    overrides = _rl_overrides(tmp_path, micro_model, arithmetic_data, name, [])
    overrides += [f"explorer.auxiliary_models=[{{model_path: {teacher}}}]"]
    (result,) = run(CONFIG, overrides, [PLUGINS])
    trainer = _finite_losses(result.job_dir)
    assert all(r[f"distill/{divergence}"] > 0 for r in trainer)  # two random models disagree
    assert weights_changed(micro_model, result.final_hf)
