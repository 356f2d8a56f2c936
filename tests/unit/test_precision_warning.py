"""Half precision on a CPU without bf16/fp16 instructions: a warning naming each key."""

import logging
import textwrap

import pytest

import trinity.common.config.gpus as gpus_module
import trinity.preflight.precision as precision
from trinity.common.config import load_config
from trinity.preflight.derive import finalize

BASE = """
project: proj
name: exp
checkpoint_root_dir: /ck
model:
  model_path: /models/tiny
  max_prompt_tokens: 100
  max_response_tokens: 28
algorithm:
  algorithm_type: grpo
  repeat_times: 2
buffer:
  batch_size: 4
  explorer_input:
    taskset: {name: train, path: /data}
"""
ACTOR = "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
REF = "trainer.trainer_config.actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype"


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 0)


def finalized(tmp_path, overrides):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(BASE))
    return finalize(load_config(str(path), list(overrides)))


def test_defaults_on_cpu_are_fp32_and_name_nothing(tmp_path):
    assert precision.half_precision_keys(finalized(tmp_path, [])) == []


def test_each_half_precision_key_is_named_with_its_override(tmp_path):
    config = finalized(
        tmp_path,
        [
            "explorer.rollout_model.dtype=bfloat16",
            f"{ACTOR}=bf16",
            f"{REF}=fp16",  # GRPO's default k2 KL loss reads the reference
        ],
    )
    assert precision.half_precision_keys(config) == [
        ("explorer.rollout_model.dtype", "bfloat16", "float32"),
        (ACTOR, "bf16", "fp32"),
        (REF, "fp16", "fp32"),
    ]


def test_an_unused_reference_and_an_explore_stage_trainer_are_not_named(tmp_path):
    no_ref = finalized(tmp_path, ["algorithm.kl_loss_fn=none", f"{REF}=bf16"])
    assert precision.half_precision_keys(no_ref) == []
    explore = finalized(tmp_path, ["mode=explore", f"{ACTOR}=bf16"])
    assert precision.half_precision_keys(explore) == []


def test_on_gpus_nothing_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 1)
    assert precision.half_precision_keys(finalized(tmp_path, [])) == []


def test_the_warning_says_why_and_gathers_the_overrides(tmp_path, monkeypatch, caplog):
    config = finalized(tmp_path, ["explorer.rollout_model.dtype=bfloat16", f"{ACTOR}=bf16"])
    monkeypatch.setattr(precision, "cpu_supports", lambda dtype: False)
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        precision.warn_half_precision(config)
    assert "- explorer.rollout_model.dtype = bfloat16" in caplog.text
    assert f"add: explorer.rollout_model.dtype=float32 {ACTOR}=fp32" in caplog.text
    caplog.clear()
    monkeypatch.setattr(precision, "cpu_supports", lambda dtype: True)
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        precision.warn_half_precision(config)
    assert caplog.text == ""
