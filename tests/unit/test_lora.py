"""LoRA through peft (``model.lora_configs``): only the adapter trains and is checkpointed, the
engines get merged weights, the reference is the base model, the export loads with peft."""

import json
import os
import textwrap

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from trinity.common.experience import Experience
from trinity.common.weights import weights_path
from trinity.preflight.derive import finalize
from trinity.trainer import checkpoint as ckpt
from trinity.trainer import lora

CONFIG = """
project: tests
name: lora
cluster: {{gpu_per_node: 0}}  # CPU ranks and CPU tensors on any machine
checkpoint_root_dir: {root}
continue_from_checkpoint: true
model:
  model_path: {model}
  max_prompt_tokens: 40
  max_response_tokens: 4
  lora_configs: [{lora}]
algorithm:
  algorithm_type: grpo
  repeat_times: 2
  optimizer: {{lr: 0.01}}
  kl_loss_fn_args: {{kl_coef: 0.1}}
buffer:
  batch_size: 2
  total_steps: 4
  explorer_input:
    default_workflow_type: math_workflow
    taskset: {{name: train, path: {data}, split: train,
               format: {{prompt_key: question, response_key: answer}}}}
"""

LORA = "{lora_rank: 4, lora_alpha: 8}"


def _config(tmp_path, micro_model, arithmetic_data, lora_entry=LORA):
    from trinity.common.config import load_config

    path = tmp_path / "config.yaml"
    text = CONFIG.format(
        root=tmp_path / "ck", model=micro_model, data=arithmetic_data["rl"], lora=lora_entry
    )
    path.write_text(textwrap.dedent(text))
    return load_config(str(path))


def _trainer(tmp_path, micro_model, arithmetic_data, lora_entry=LORA):
    from trinity.trainer.trainer import Trainer

    config = finalize(_config(tmp_path, micro_model, arithmetic_data, lora_entry))
    trainer = Trainer(config, planned_steps=4, log=lambda metrics, step: None)
    trainer.prepare_model()
    trainer.attach_reader(reader=None)
    return trainer


def _experiences(tokenizer):
    prompt = tokenizer.encode("1+1=")
    return [
        Experience(
            tokens=prompt + tokenizer.encode(answer),
            prompt_length=len(prompt),
            reward=reward,
            logprobs=[-1.0] * len(answer),
            group_id="g",
        )
        for answer, reward in (("2", 1.0), ("37", 0.0))
    ]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.fixture
def trained(tmp_path, micro_model, arithmetic_data):
    """A LoRA trainer after one GRPO step (so B != 0 and the adapter changes the outputs)."""
    trainer = _trainer(tmp_path, micro_model, arithmetic_data)
    trainer.step = 1
    trainer.train_step(_experiences(trainer.tokenizer))
    return trainer


def test_only_the_adapter_trains_and_the_base_stays_bit_identical(trained, micro_model):
    trainable = [n for n, p in trained.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = [p for group in trained.optimizer.param_groups for p in group["params"]]
    assert len(in_optimizer) == len(trainable)
    assert {id(p) for p in in_optimizer} == {
        id(p) for p in trained.model.parameters() if p.requires_grad
    }
    # every base weight unchanged by the step, bit for bit
    base = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32).state_dict()
    current = trained.model.get_base_model().state_dict()
    for name, tensor in base.items():
        wrapped = name.replace(".weight", ".base_layer.weight")
        assert torch.equal(current.get(wrapped, current.get(name)), tensor), name
    # the step moved B away from its zero init
    assert any(p.abs().sum() > 0 for n, p in trained.model.named_parameters() if ".lora_B." in n)


def test_merged_weights_are_w_plus_scaled_b_a_and_give_the_peft_logprobs(trained, micro_model):
    merged = lora.merged_state_dict(trained.model)
    layer = trained.model.get_base_model().model.layers[0].self_attn.q_proj
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    # scale = lora_alpha / lora_rank = 8 / 4
    by_hand = layer.base_layer.weight + 2.0 * b @ a
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], by_hand, atol=1e-7)
    # the merged dict names only adapted layers, under the base model's names
    engine = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32)
    assert set(merged) < set(engine.state_dict())
    assert all(n.endswith("_proj.weight") for n in merged)
    engine.load_state_dict(merged, strict=False)
    ids = trained.tokenizer.encode("3+4=7")
    trained.model.eval()
    expected = torch.log_softmax(_logits(trained.model, ids), -1)
    got = torch.log_softmax(_logits(engine, ids), -1)
    assert torch.allclose(got, expected, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32)
    assert not torch.allclose(torch.log_softmax(_logits(base, ids), -1), expected, atol=1e-5)


def test_sync_sends_merged_layers_with_lora_and_everything_without(trained, micro_model):
    assert set(lora.sync_state_dict(trained.model)) == set(lora.merged_state_dict(trained.model))
    plain = AutoModelForCausalLM.from_pretrained(micro_model)
    assert set(lora.sync_state_dict(plain)) == set(plain.state_dict())


def test_reference_logprobs_are_the_base_models(trained, micro_model):
    batch = trained._batch(_experiences(trained.tokenizer))
    trained._prepare_batch(batch)
    assert trained.ref_model is None and trained.ref_is_base
    reference = trained._score(
        AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32).eval(), batch
    )
    mask = batch.action_mask.bool()  # padding positions hold no logprob
    assert torch.allclose(batch.ref_logprob[mask], reference[mask], atol=1e-6)
    assert trained.model.training  # scoring the base left the policy in training mode
    with torch.no_grad():
        policy = trained._score(trained.model, batch)
    assert not torch.allclose(policy[mask], reference[mask], atol=1e-4)


def test_checkpoint_holds_only_the_adapter_and_resume_restores_it(
    trained, tmp_path, micro_model, arithmetic_data
):
    trained.save(final=False)
    path = weights_path(trained.job_dir, 1)
    with safe_open(path, framework="pt") as f:
        names = list(f.keys())
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert sorted(names) == sorted(lora.adapter_state_dict(trained.model))

    resumed = _trainer(tmp_path, micro_model, arithmetic_data)
    assert resumed.step == 1
    for (name, a), (_, b) in zip(
        trained.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    saved, loaded = trained.optimizer.state_dict(), resumed.optimizer.state_dict()
    for key, value in saved["state"].items():
        assert all(torch.equal(value[k], loaded["state"][key][k]) for k in value)


def test_resume_without_lora_from_a_lora_checkpoint_says_so(
    trained, tmp_path, micro_model, arithmetic_data
):
    from trinity.trainer.trainer import Trainer

    trained.save(final=False)
    config = _config(tmp_path, micro_model, arithmetic_data, LORA)
    config.model.lora_configs = None
    trainer = Trainer(finalize(config), 4, log=lambda metrics, step: None)
    with pytest.raises(ckpt.CheckpointError, match="holds a LoRA adapter.*model.lora_configs"):
        trainer.prepare_model()


def test_hf_export_is_a_peft_adapter_and_merged_model(tmp_path, micro_model, arithmetic_data):
    from peft import PeftModel

    entry = "{lora_rank: 4, lora_alpha: 8, save_merged: true, base_model_name: org/micro}"
    trainer = _trainer(tmp_path, micro_model, arithmetic_data, entry)
    trainer.step = 1
    trainer.train_step(_experiences(trainer.tokenizer))
    trainer.save(final=True)
    hf = os.path.join(ckpt.step_dir(trainer.job_dir, 1), "hf")
    assert {"adapter_config.json", "adapter_model.safetensors", "merged"} <= set(os.listdir(hf))
    with open(os.path.join(hf, "adapter_config.json")) as f:
        adapter_config = json.load(f)
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 8)
    assert adapter_config["base_model_name_or_path"] == "org/micro"

    ids = trainer.tokenizer.encode("2+2=4")
    trainer.model.eval()
    expected = _logits(trainer.model, ids)
    base = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, hf).eval()
    assert torch.allclose(_logits(loaded, ids), expected, atol=1e-6)
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(hf, "merged")).eval()
    assert torch.allclose(_logits(merged, ids), expected, atol=1e-5)


def test_pretrained_adapter_path_and_engine_start_from_it(
    tmp_path, micro_model, arithmetic_data, trained
):
    from trinity.engine.hf_engine import TransformersEngine

    adapter = str(tmp_path / "adapter")
    lora.export_adapter(trained.model, adapter)
    # rank and alpha come from the folder (r 4, alpha 8), not from the entry's defaults
    (tmp_path / "b").mkdir()
    started = _trainer(tmp_path / "b", micro_model, arithmetic_data, f"{{path: {adapter}}}")
    assert started.step == 0
    for name, tensor in lora.adapter_state_dict(trained.model).items():
        assert torch.equal(lora.adapter_state_dict(started.model)[name], tensor), name
    engine = TransformersEngine(
        micro_model, max_model_len=64, max_prompt_tokens=40, max_response_tokens=4,
        adapter_path=adapter,
    )  # fmt: skip
    weights = engine.model.state_dict()
    for name, tensor in lora.merged_state_dict(started.model).items():
        assert torch.allclose(weights[name], tensor, atol=1e-7), name


def test_lora_dtype_sets_the_adapter_dtype_only(tmp_path, micro_model, arithmetic_data):
    entry = "{lora_rank: 4, lora_dtype: bfloat16}"
    trainer = _trainer(tmp_path, micro_model, arithmetic_data, entry)
    dtypes = {p.dtype for p in trainer.model.parameters() if p.requires_grad}
    assert dtypes == {torch.bfloat16}
    assert trainer.model.get_base_model().dtype == torch.float32
    trainer.step = 1
    metrics = trainer.train_step(_experiences(trainer.tokenizer))
    assert metrics["actor/grad_norm"] > 0


# ---- config errors, before Ray starts ----------------------------------------------------


def _problems(tmp_path, micro_model, arithmetic_data, entry, extra=""):
    from trinity.common.config import ConfigError, load_config
    from trinity.preflight.before_start import check_before_start

    text = CONFIG.format(
        root=tmp_path / "ck", model=micro_model, data=arithmetic_data["rl"], lora=entry
    )
    path = tmp_path / "problems.yaml"
    path.write_text(textwrap.dedent(text) + extra)
    try:
        check_before_start(load_config(str(path)))
    except ConfigError as exc:
        return exc.problems
    return []


def test_a_good_lora_config_passes(tmp_path, micro_model, arithmetic_data):
    entry = "{lora_rank: 4, target_modules: [q_proj, v_proj]}"
    assert _problems(tmp_path, micro_model, arithmetic_data, entry) == []
    entry = "{target_modules: '.*mlp\\.(up|down)_proj'}"
    assert _problems(tmp_path, micro_model, arithmetic_data, entry) == []


@pytest.mark.parametrize(
    "entry, expected",
    [
        (
            "{lora_rank: 0}",
            "model.lora_configs[0].lora_rank = 0 must be >= 1",
        ),
        (
            "{lora_dtype: int4}",
            "model.lora_configs[0].lora_dtype = int4 is not supported yet (supported: auto, "
            "float32, bfloat16, float16)",
        ),
        (
            "{target_modules: [q_proj, qproj]}",
            "model.lora_configs[0].target_modules: 'qproj' names no layer of {model}; LoRA "
            "adapts Linear layers, here named down_proj, gate_proj, k_proj, lm_head, o_proj, "
            "q_proj, up_proj, v_proj",
        ),
        (
            "{target_modules: [embed_tokens]}",
            "model.lora_configs[0].target_modules: 'embed_tokens' is not a Linear layer of "
            "{model}; LoRA adapts Linear layers, here named down_proj, gate_proj, k_proj, "
            "lm_head, o_proj, q_proj, up_proj, v_proj",
        ),
        (
            "{target_modules: [q_proj, lm_head]}",
            "model.lora_configs[0].target_modules: 'lm_head' takes in the output layer, which "
            "shares its weight with the input embeddings (tie_word_embeddings), so merged "
            "weights would change both; leave it out",
        ),
        (
            "{target_modules: '.*'}",
            "model.lora_configs[0].target_modules: '.*' takes in the output layer, which "
            "shares its weight with the input embeddings (tie_word_embeddings), so merged "
            "weights would change both; leave it out",
        ),
        (
            "{path: /nonexistent/adapter}",
            "model.lora_configs[0].path = /nonexistent/adapter: no such folder "
            "/nonexistent/adapter (a peft adapter folder, or a hub id of one, is expected)",
        ),
    ],
)
def test_bad_lora_entries_name_the_key(tmp_path, micro_model, arithmetic_data, entry, expected):
    found = _problems(tmp_path, micro_model, arithmetic_data, entry)
    assert found == [expected.format(model=micro_model)]


def test_two_adapters_are_refused_checkpoint_sync_and_explore_mode_pass(
    tmp_path, micro_model, arithmetic_data
):
    two = "{lora_rank: 4}, {lora_rank: 8}"
    assert _problems(tmp_path, micro_model, arithmetic_data, two) == [
        "model.lora_configs has 2 entries, but only one adapter is supported: keep one"
    ]
    ranks = "trainer: {cpu_ranks: 2}\n"
    (found,) = _problems(tmp_path, micro_model, arithmetic_data, LORA, ranks)
    assert "model.lora_configs" in found and "trainer.cpu_ranks = 2" in found
    # the engines merge a checkpoint's adapter over their base (test_checkpoint_sync_* below);
    # an explore run of a decoupled pair loads the adapters its train run saves
    sync = "synchronizer: {sync_method: checkpoint}\n"
    assert _problems(tmp_path, micro_model, arithmetic_data, LORA, sync) == []
    assert _problems(tmp_path, micro_model, arithmetic_data, LORA, "mode: explore\n") == []


def test_a_lora_stage_handed_over_needs_merged_weights(tmp_path, micro_model, arithmetic_data):
    stages = "stages:\n  - {stage_name: a}\n  - {stage_name: b}\n"
    found = _problems(tmp_path, micro_model, arithmetic_data, LORA, stages)
    assert found == [
        "stage 'a': model.lora_configs[0].save_merged = false, but the next stage starts from "
        "this stage's final HF checkpoint, which then holds only the adapter; set "
        "save_merged: true"
    ]
    merged = "{lora_rank: 4, save_merged: true}"
    assert _problems(tmp_path, micro_model, arithmetic_data, merged, stages) == []


def test_adapter_folder_keys_conflicting_with_the_entry(tmp_path, micro_model, arithmetic_data):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})
    )
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    entry = f"{{path: {adapter}, lora_rank: 16}}"
    assert _problems(tmp_path, micro_model, arithmetic_data, entry) == [
        f"model.lora_configs[0].lora_rank = 16, but the adapter at {adapter} has r = 4; "
        "remove lora_rank (the adapter's own wins)"
    ]


def test_without_peft_lora_is_a_config_error(tmp_path, micro_model, arithmetic_data, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    assert _problems(tmp_path, micro_model, arithmetic_data, LORA) == [
        "model.lora_configs needs the peft package, which is not installed: pip install peft"
    ]
