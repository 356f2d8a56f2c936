"""``checkpoint`` sync of a LoRA run: the checkpoint holds the adapter and its layout, and an
engine merges it over its base weights, getting exactly what a ``memory`` sync would send."""

import asyncio

import pytest
import torch
from safetensors import safe_open

from tests.unit.test_lora import _experiences, _trainer
from trinity.common.adapter_weights import LAYOUT_KEY, Adapter, read_sync_weights
from trinity.common.models.sampling import SamplingParams
from trinity.common.weights import weights_path
from trinity.engine.hf_engine import TransformersEngine
from trinity.engine.transformers_model import TransformersInferenceModel
from trinity.trainer import lora

LIMITS = {"max_model_len": 64, "max_prompt_tokens": 40, "max_response_tokens": 8}


@pytest.fixture
def trainer(tmp_path, micro_model, arithmetic_data):
    return _trainer(tmp_path, micro_model, arithmetic_data)


def _step(trainer) -> str:
    """One GRPO step, saved: the checkpoint's weights file (what checkpoint sync sends)."""
    trainer.step += 1
    trainer.train_step(_experiences(trainer.tokenizer))
    trainer.save(final=False)
    return weights_path(trainer.job_dir, trainer.step)


def _greedy_logprobs(engine, tokenizer) -> list:
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
    (out,) = engine.generate([tokenizer.encode("3+4=")], [params])[0]
    return out.logprobs


def test_the_checkpoint_holds_the_adapter_and_its_layout(trainer):
    path = _step(trainer)
    with safe_open(path, framework="pt") as f:
        names, metadata = set(f.keys()), f.metadata()
    assert names == set(lora.adapter_state_dict(trainer.model))
    adapter = read_sync_weights(path)
    assert isinstance(adapter, Adapter) and LAYOUT_KEY in metadata
    pair = adapter.layers["model.layers.0.self_attn.q_proj.weight"]
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    # lora_alpha / lora_rank = 8 / 4; the base weights trained in float32
    assert (pair.a, pair.b, pair.scale, pair.transpose) == (
        f"{prefix}.lora_A.weight",
        f"{prefix}.lora_B.weight",
        2.0,
        False,
    )
    assert adapter.dtype == "float32"
    assert set(adapter.layers) == set(lora.merged_state_dict(trainer.model))


def test_checkpoint_sync_gives_the_engine_what_memory_sync_gives(trainer, micro_model):
    by_checkpoint = TransformersInferenceModel(model_path=micro_model, **LIMITS)
    by_memory = TransformersEngine(micro_model, **LIMITS)
    base = {k: v.clone() for k, v in by_memory.model.state_dict().items()}
    before = _greedy_logprobs(by_memory, trainer.tokenizer)
    for version in (1, 2):  # the second adapter replaces the first, it does not add to it
        path = _step(trainer)
        asyncio.run(by_checkpoint.load_weights(path, version))
        by_memory.load_state_dict(lora.merged_state_dict(trainer.model))
        assert asyncio.run(by_checkpoint.model_version()) == version
        weights = by_checkpoint.engine.model.state_dict()
        layer = trainer.model.get_base_model().model.layers[0].self_attn.q_proj
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        name = "model.layers.0.self_attn.q_proj.weight"
        assert torch.allclose(weights[name], base[name] + 2.0 * b @ a, atol=1e-6)
        for name, tensor in by_memory.model.state_dict().items():
            assert torch.equal(weights[name], tensor), name  # the same merge, bit for bit
        after = _greedy_logprobs(by_checkpoint.engine, trainer.tokenizer)
        assert after == pytest.approx(_greedy_logprobs(by_memory, trainer.tokenizer), abs=1e-6)
    assert after != pytest.approx(before, abs=1e-4)  # the adapter changed the model


def test_an_engine_started_from_an_adapter_folder_merges_later_ones_over_the_base(
    tmp_path, micro_model, arithmetic_data, trainer
):
    _step(trainer)
    folder = str(tmp_path / "adapter")
    lora.export_adapter(trainer.model, folder)
    (tmp_path / "b").mkdir()
    started = _trainer(tmp_path / "b", micro_model, arithmetic_data, f"{{path: {folder}}}")
    engine = TransformersEngine(micro_model, adapter_path=folder, **LIMITS)
    weights = engine.model.state_dict()
    for name, tensor in lora.merged_state_dict(started.model).items():
        assert torch.equal(weights[name], tensor), name
    engine.load_adapter(read_sync_weights(_step(started)))
    weights = engine.model.state_dict()
    for name, tensor in lora.merged_state_dict(started.model).items():
        assert torch.equal(weights[name], tensor), name


def test_an_engine_without_load_adapter_says_so(trainer, micro_model):
    path = _step(trainer)
    model = TransformersInferenceModel(model_path=micro_model, **LIMITS)
    model.engine = type("Plain", (), {"load_state_dict": lambda self, weights: None})()
    with pytest.raises(ValueError, match="model version 1 is a LoRA adapter, which the Plain"):
        asyncio.run(model.load_weights(path, 1))
