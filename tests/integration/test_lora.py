"""GRPO with a LoRA adapter (``model.lora_configs``) on the micro model, through Ray: only
the adapter is checkpointed, the engines sample with the merged weights the trainer sends
(so their logprobs are the trainer's), and a run resumes from its adapter checkpoint."""

import os
import sqlite3

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from tests.integration.conftest import HERE, base_overrides
from tests.integration.test_run import CONFIG, records, weights_changed
from trinity.runtime.launcher import run

# A high lr for a tiny adapter: after one step the merged model differs visibly from the base.
LORA = [
    "model.lora_configs=[{lora_rank: 8, lora_alpha: 16, save_merged: true}]",
    "algorithm.optimizer.lr=0.02",
    "buffer.explorer_input.eval_tasksets=[]",
    "trainer.save_hf_checkpoint=always",
    "buffer.explorer_input.default_reward_fn_type=parity_reward",  # reward varies: it learns
]
PLUGINS = [os.path.join(HERE, "plugins")]


def _logprobs(model_dir: str, text_ids: list) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([text_ids])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(text_ids[1:])[:, None])


def test_lora_grpo_syncs_merged_weights_and_resumes(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + LORA
    (result,) = run(CONFIG, overrides + ["buffer.total_steps=2"], PLUGINS)
    job = result.job_dir
    trainer = records(job, "trainer")
    assert [r["step"] for r in trainer] == [1, 2]

    # the checkpoint's weights file holds the adapter only
    with safe_open(os.path.join(job, "global_step_1", "actor", "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    hf = os.path.join(job, "global_step_1", "hf")
    assert {"adapter_config.json", "adapter_model.safetensors", "merged"} <= set(os.listdir(hf))
    assert result.final_hf == os.path.join(job, "global_step_2", "hf", "merged")

    # After step 1 the merged model scores text differently from the base...
    ids = list(range(5, 25))
    moved = (_logprobs(micro_model, ids) - _logprobs(os.path.join(hf, "merged"), ids)).abs()
    assert moved.max() > 1e-3
    # ...yet at step 2 the engine's rollout logprobs (sampled with version 1) equal the
    # trainer's (model after step 1): ppo_kl = mean(old - new) over the response tokens.
    assert abs(trainer[1]["actor/ppo_kl"]) < 1e-5, trainer[1]["actor/ppo_kl"]
    assert abs(trainer[0]["actor/ppo_kl"]) < 1e-5  # step 1: both at the base weights

    # Resume from the step-2 adapter checkpoint and train one more step.
    (resumed,) = run(CONFIG, overrides + ["buffer.total_steps=3"], PLUGINS)
    trainer = records(resumed.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    assert abs(trainer[2]["actor/ppo_kl"]) < 1e-5  # the engines got the resumed weights
    assert resumed.final_hf == os.path.join(job, "global_step_3", "hf", "merged")
    assert weights_changed(os.path.join(job, "global_step_2", "hf", "merged"), resumed.final_hf)


def test_lora_grpo_with_checkpoint_sync_samples_each_version_exactly(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + LORA
    sync = ["synchronizer.sync_method=checkpoint", "buffer.total_steps=3"]
    (result,) = run(CONFIG, overrides + sync, PLUGINS)
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    # Each step's experiences were sampled with the adapter checkpoint of the step before,
    # merged over the engine's base: their logprobs equal the trainer's recomputed ones
    # (ppo_kl = mean(old - new)), as with memory sync above.
    assert all(abs(r["actor/ppo_kl"]) < 1e-5 for r in trainer), [r["actor/ppo_kl"] for r in trainer]
    ids = list(range(5, 25))
    assert (_logprobs(micro_model, ids) - _logprobs(result.final_hf, ids)).abs().max() > 1e-3
    # each experience carries the version that sampled it: explore step s, version s - 1
    with sqlite3.connect(os.path.join(result.job_dir, "buffer", "experience_buffer.db")) as db:
        versions = set(db.execute("SELECT step, model_version FROM experience_buffer"))
    assert versions == {(1, 0), (2, 1), (3, 2)}
