"""GPU arithmetic (``common/config/gpus.py``): the cluster's ``node_num`` x ``gpu_per_node``
GPUs, ``engine_num`` x ``tensor_parallel_size`` per served model, the rest for the trainer;
which actor gets which bundle (``runtime/gpu_bundles.py``); which stages may use Ray."""

import pytest

import trinity.common.config.gpus as gpus_module
from tests.unit.test_nodes import finalized, problems
from trinity.preflight.before_start import _process_problems
from trinity.runtime.gpu_bundles import gpu_slots

AUXILIARY = "explorer.auxiliary_models=[{model_path: /models/judge, engine_num: %d}]"
TRAIN = [
    "mode=train",
    "algorithm.algorithm_type=sft",
    "buffer.trainer_input.experience_buffer.path=/d",
]


@pytest.fixture(autouse=True)
def four_gpus(monkeypatch):
    """This machine shows torch 4 GPUs (none is touched: the checks only count them)."""
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 4)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_engines_take_theirs_and_the_trainer_the_one_left(tmp_path):
    config = finalized(
        tmp_path,
        ["cluster.gpu_per_node=4", "explorer.rollout_model.engine_num=2", AUXILIARY % 1],
    )
    shares = gpus_module.gpu_shares(config)
    assert (shares.total, shares.engine_gpus, shares.trainer_gpus) == (4, 3, 1)
    assert gpu_slots(config) == [
        ("trainer", 1),
        ("explorer_engine_0", 1),
        ("explorer_engine_1", 1),
        ("explorer_auxiliary_0_engine_0", 1),
    ]


def test_a_trainer_left_with_several_gpus_is_not_supported_yet(tmp_path):
    found = problems(tmp_path, ["cluster.gpu_per_node=4", "explorer.rollout_model.engine_num=2"])
    assert found == [
        "explorer.rollout_model.engine_num (2) x tensor_parallel_size (1) = 2 GPUs for the "
        "engines leave 2 of cluster.node_num (1) x cluster.gpu_per_node (4) = 4 for the "
        "trainer: a trainer on more than one GPU (FSDP2 ranks over NCCL) is not supported "
        "yet; set cluster.gpu_per_node: 3 or raise engine_num by 1"
    ]


def test_engines_must_leave_the_trainer_a_gpu(tmp_path):
    overrides = ["cluster.gpu_per_node=4", "explorer.rollout_model.engine_num=2", AUXILIARY % 2]
    assert problems(tmp_path, overrides) == [
        "explorer.rollout_model.engine_num (2) x tensor_parallel_size (1) + "
        "explorer.auxiliary_models[0].engine_num (2) x tensor_parallel_size (1) = 4 GPUs for "
        "the engines leave 0 of cluster.node_num (1) x cluster.gpu_per_node (4) = 4 for the "
        "trainer, which needs at least 1; lower engine_num (the engines may take 3 at most)"
    ]


def test_an_explore_stage_needs_a_gpu_per_engine_and_may_leave_some_idle(tmp_path):
    explore = ["mode=explore", "cluster.gpu_per_node=2"]
    found = problems(tmp_path, explore + ["explorer.rollout_model.engine_num=3"])
    assert found == [
        "explorer.rollout_model.engine_num (3) x tensor_parallel_size (1) = 3 GPUs for the "
        "engines, more than the cluster.node_num (1) x cluster.gpu_per_node (2) = 2 of the "
        "cluster; lower engine_num (the engines may take 2 at most)"
    ]
    assert gpu_slots(finalized(tmp_path, explore)) == [("explorer_engine_0", 1)]


def test_a_train_stage_takes_every_gpu(tmp_path):
    assert gpu_slots(finalized(tmp_path, TRAIN + ["cluster.gpu_per_node=1"])) == [("trainer", 1)]
    assert problems(tmp_path, TRAIN + ["cluster.gpu_per_node=2"]) == [
        "the trainer takes all cluster.node_num (1) x cluster.gpu_per_node (2) = 2 GPUs: a "
        "trainer on more than one GPU (FSDP2 ranks over NCCL) is not supported yet; set "
        "cluster.gpu_per_node: 1"
    ]


def test_tensor_parallel_engines_are_refused_on_gpus_only(tmp_path):
    tp = ["explorer.rollout_model.tensor_parallel_size=2"]
    # said by preflight/hardware.py, which overrides it with 1 (test_hardware.py)
    assert problems(tmp_path, tp + ["cluster.gpu_per_node=3"]) == [
        "explorer.rollout_model.tensor_parallel_size = 2: an engine runs on one GPU here "
        "(tensor parallelism is not supported yet)"
    ]
    finalized(tmp_path, tp + ["cluster.gpu_per_node=0"])  # on CPU it has no effect


def test_colocate_is_one_gpu(tmp_path):
    assert problems(tmp_path, ["mode=colocate", "cluster.gpu_per_node=2"]) == [
        "mode colocate runs the trainer and the engines in one process on one GPU, but "
        "cluster.node_num (1) x cluster.gpu_per_node (2) = 2 GPUs; set cluster.gpu_per_node: 1"
    ]
    # unset, it takes the first of the machine's 4
    assert finalized(tmp_path, ["mode=colocate"]).cluster.gpu_per_node == 1


def test_gpus_this_machine_lacks_are_the_one_problem_said(tmp_path):
    # the arithmetic assumes the GPUs: preflight/hardware.py says what fits here instead
    found = problems(tmp_path, ["cluster.gpu_per_node=8", "explorer.rollout_model.engine_num=2"])
    assert found == [
        "cluster.gpu_per_node = 8 but this machine has 4 GPU(s) visible to torch; the stage "
        "fits on 3 GPU(s)"
    ]


def test_external_engines_take_no_gpu():
    shares = gpus_module.GpuShares(
        1, 2, (gpus_module.EngineShare("explorer.rollout_model", 1, 1),), trains=True
    )
    assert shares.problems() == []
    assert gpus_module.GpuShares(1, 2, (), trains=True).problems() == [
        "the trainer takes all cluster.node_num (1) x cluster.gpu_per_node (2) = 2 GPUs: a "
        "trainer on more than one GPU (FSDP2 ranks over NCCL) is not supported yet; set "
        "cluster.gpu_per_node: 1"
    ]


def test_one_gpu_is_shared_in_one_process_or_given_to_the_one_role_on_ray(tmp_path):
    both = finalized(tmp_path, ["cluster.gpu_per_node=1"])
    assert gpu_slots(both) == []  # trainer and engine share it in this process
    on_ray = finalized(tmp_path, ["cluster.gpu_per_node=1", "cluster.in_process=false"])
    assert _process_problems(on_ray) == [
        "cluster.gpu_per_node = 1: the trainer and the engines share the one GPU in one "
        "process, but this stage needs Ray (cluster.in_process is false); remove what needs "
        "Ray, or give each role a GPU of its own (cluster.gpu_per_node: 2)"
    ]
    train = finalized(tmp_path, TRAIN + ["cluster.gpu_per_node=1", "cluster.in_process=false"])
    assert _process_problems(train) == [] and gpu_slots(train) == [("trainer", 1)]


def test_several_gpus_send_the_stage_to_ray(tmp_path):
    from trinity.preflight.hosting import ray_reasons

    config = finalized(tmp_path, ["cluster.gpu_per_node=2"])
    assert ray_reasons(config) == ["2 GPUs (cluster.node_num x gpu_per_node), each role on its own"]
    assert _process_problems(config) == []
