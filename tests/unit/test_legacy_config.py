"""Configs written for earlier Trinity-RFT releases (DESIGN decision 20): renamed keys and
values are read as their current form with one line each, keys that mean nothing here are
dropped with one line saying why, keys whose meaning is not built are refused by name."""

import logging
import textwrap

import pytest
import yaml

from tests.unit.test_config_compat import BASE
from trinity.common.config import ConfigError, load_config
from trinity.common.config.legacy import DROPPED, REFUSED, RENAMED
from trinity.common.config.legacy_read import expand, read_earlier_names

ROLLOUT = "explorer.rollout_model"
AUX = "buffer.trainer_input.auxiliary_buffers"
EXP = "buffer.trainer_input.experience_buffer"
ACTOR = "trainer.trainer_config.actor_rollout_ref.actor"


def nested(path, value):
    """``a.b.0.c`` -> {a: {b: [{c: value}]}}."""
    head, _, rest = path.partition(".")
    inner = nested(rest, value) if rest else value
    return [inner] if head == "0" else {head: inner}


def merge(a, b):
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(a.get(key), dict):
            merge(a[key], value)
        elif isinstance(value, list) and isinstance(a.get(key), list):  # one item each
            merge(a[key][0], value[0])
        else:
            a[key] = value
    return a


def read(*pairs):
    """``read_earlier_names`` of a config made of (path, value) pairs."""
    data = {}
    for path, value in pairs:
        merge(data, nested(path, value))
    return read_earlier_names(data)


def get(data, path):
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "trinity.config"]


# Earlier key (a concrete path) -> (value written, where it is read, value read there).
RENAMED_CASES = {
    "explorer.runner_num": (32, "explorer.runner_per_model", 32),
    "explorer.eval_on_latest_checkpoint": (True, "explorer.bench_on_latest_checkpoint", True),
    "trainer.actor_use_kl_loss": (True, f"{ACTOR}.use_kl_loss", True),
    "trainer.actor_kl_loss_coef": (0.01, f"{ACTOR}.kl_loss_coef", 0.01),
    "trainer.actor_entropy_coef": (0.002, f"{ACTOR}.entropy_coeff", 0.002),
    "trainer.actor_clip_ratio": (0.3, f"{ACTOR}.clip_ratio", 0.3),
    "trainer.actor_grad_clip": (0.5, "trainer.grad_clip", 0.5),
    "algorithm.gamma": (0.99, "trainer.trainer_config.algorithm.gamma", 0.99),
    "algorithm.lam": (0.95, "trainer.trainer_config.algorithm.lam", 0.95),
    "algorithm.optimizer.warmup_style": (
        "cosine",
        "algorithm.optimizer.lr_scheduler_type",
        "cosine",
    ),
    f"{ACTOR}.optim.warmup_style": ("cosine", f"{ACTOR}.optim.lr_scheduler_type", "cosine"),
    "trainer.trainer_config.critic.optim.warmup_style": (
        "cosine",
        "trainer.trainer_config.critic.optim.lr_scheduler_type",
        "cosine",
    ),
    "model.enable_thinking": (True, f"{ROLLOUT}.enable_thinking", True),
    f"{ACTOR}.optim.beta1": (0.8, f"{ACTOR}.optim.betas", (0.8, 0.999)),
    f"{ACTOR}.optim.beta2": (0.95, f"{ACTOR}.optim.betas", (0.9, 0.95)),
    f"{EXP}.use_priority_queue": (True, f"{EXP}.replay_buffer.enable", True),
    f"{EXP}.reuse_cooldown_time": (5.0, f"{EXP}.replay_buffer.reuse_cooldown_time", 5.0),
    f"{EXP}.replay_buffer_kwargs.priority_fn": (
        "linear_decay",
        f"{EXP}.replay_buffer.priority_fn",
        "linear_decay",
    ),
    f"{EXP}.replay_buffer_kwargs": ({"decay": 2.0}, f"{EXP}.replay_buffer.priority_fn_args", {}),
}


def test_every_renamed_key_has_a_case_here():
    """A row added to RENAMED without a case below fails here."""
    patterns = {p for old in RENAMED for p in expand(old)}
    covered = {
        p for p in patterns if any(case == p.replace("<storage>", EXP) for case in RENAMED_CASES)
    }
    storage_rows = {p for p in patterns if p.startswith(EXP + ".")}
    plain = {p for p in patterns if "<storage>" not in p and not p.startswith("buffer.")}
    assert plain | storage_rows <= covered | set(RENAMED_CASES), (plain | storage_rows) - covered


@pytest.mark.parametrize("old", sorted(RENAMED_CASES))
def test_a_renamed_key_is_read_as_its_current_one_with_one_line(old, caplog):
    value, new, expected = RENAMED_CASES[old]
    if old.endswith("replay_buffer_kwargs"):  # its priority_fn has a row of its own
        value = {"priority_fn": "linear_decay", "decay": 2.0}
        expected = {"decay": 2.0}
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, refused = read((old, value))
    assert refused == []
    found = get(data, new)
    assert (list(found) if isinstance(found, tuple) else found) == (
        list(expected) if isinstance(expected, tuple) else expected
    )
    mine = [line for line in lines(caplog) if line.startswith(old + " =")]
    assert len(mine) == 1 and f"is read as {new} = " in mine[0], lines(caplog)


def test_runner_num_counted_every_engine(caplog):
    """0.1.1's runner_num was the total over the engines; runner_per_model is per engine."""
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, _ = read(("explorer.runner_num", 32), (f"{ROLLOUT}.engine_num", 3))
    assert data["explorer"] == {"runner_per_model": 11, "rollout_model": {"engine_num": 3}}
    assert lines(caplog) == [
        "explorer.runner_num = 32 (Trinity-RFT 0.1.1 and earlier) is read as "
        "explorer.runner_per_model = 11 (runner_num counted the runners of all engines: "
        "divided by explorer.rollout_model.engine_num, rounded up)"
    ]


def test_runner_per_model_wins_over_runner_num_as_it_did_in_the_original(caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, refused = read(("explorer.runner_num", 32), ("explorer.runner_per_model", 4))
    assert refused == [] and data["explorer"] == {"runner_per_model": 4}
    assert (
        "explorer.runner_num = 32 is not read: explorer.runner_per_model = 4 is set"
        in (lines(caplog)[0])
    )


def test_an_earlier_key_and_its_current_one_set_differently_are_refused_naming_both():
    _, refused = read(("trainer.actor_grad_clip", 0.5), ("trainer.grad_clip", 2.0))
    assert refused == [
        "trainer.actor_grad_clip = 0.5 (the Trinity-RFT 0.1.1 name of trainer.grad_clip) and "
        "trainer.grad_clip = 2.0 disagree; set only trainer.grad_clip"
    ]


@pytest.mark.parametrize(
    "path, old, new",
    [
        ("synchronizer.sync_style", "dynamic_by_explorer", "explorer_driven"),
        ("synchronizer.sync_style", "dynamic_by_trainer", "trainer_driven"),
        ("synchronizer.sync_method", "online", "nccl"),
        ("synchronizer.sync_method", "offline", "checkpoint"),
        (f"{ROLLOUT}.engine_type", "vllm_async", "vllm"),
        ("explorer.auxiliary_models.0.engine_type", "vllm_async", "vllm"),
        ("synchronizer.sync_method", "CHECKPOINT", "checkpoint"),
        ("buffer.explorer_input.taskset.storage_type", "FILE", "file"),
        (f"{EXP}.format.prompt_type", "Messages", "messages"),
    ],
)
def test_a_renamed_value_is_read_as_its_current_one_with_one_line(path, old, new, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, _ = read((path, old))
    assert get(data, path) == new
    shown = path.replace(".0.", "[0].")
    assert lines(caplog) == [f"{shown} = {old} ({_why(old)}) is read as {new}"]


def _why(old):
    if old.lower() != old:
        return "the original read these names in any case"
    until = {"dynamic_by_explorer": "0.5.0", "dynamic_by_trainer": "0.5.0", "vllm_async": "0.3.1"}
    return f"Trinity-RFT {until.get(old, '0.1.1')} and earlier"


def test_current_values_are_left_alone(caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, _ = read(
            ("synchronizer.sync_style", "explorer_driven"), (f"{ROLLOUT}.engine_type", "vllm")
        )
    assert data["synchronizer"]["sync_style"] == "explorer_driven" and lines(caplog) == []


def _example_path(pattern):
    """A concrete path for a DROPPED/REFUSED pattern (the experience buffer for <storage>)."""
    path = expand(pattern)[0] if not pattern.startswith("<storage>") else pattern
    return (
        path.replace("<storage>", EXP)
        .replace("*", "0")
        .replace("auxiliary_buffers.0", "auxiliary_buffers.expert")
    )


@pytest.mark.parametrize("pattern", sorted(DROPPED))
def test_a_dropped_key_says_what_it_did_and_why_it_does_nothing_here(pattern, caplog):
    path = _example_path(pattern)
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, refused = read((path, 3))
    assert refused == []
    with pytest.raises((KeyError, IndexError, TypeError)):
        get(data, path)
    shown = path.replace(".0.", "[0].").replace(".0", "[0]")
    dropped = DROPPED[pattern]
    assert [line for line in lines(caplog) if line.startswith(shown + " =")] == [
        f"{shown} = 3 (Trinity-RFT {dropped.until} and earlier: {dropped.did}) is not read "
        f"here: {dropped.why}"
    ]


def test_dropped_keys_of_one_reason_share_one_line(caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        read(
            ("buffer.max_retry_times", 3),
            ("data_processor.db_url", ""),
            ("data_processor.clean_strategy", "iterative"),
        )
    assert len(lines(caplog)) == 2
    assert lines(caplog)[1].startswith(
        "data_processor.clean_strategy = iterative, data_processor.db_url = '' (Trinity-RFT "
        "0.1.1 and earlier: settings of 0.1.1's Data-Juicer data-workflow server"
    )


@pytest.mark.parametrize("pattern", sorted(REFUSED))
def test_a_refused_key_is_named_with_what_to_write_instead(pattern):
    path = _example_path(pattern)
    _, refused = read((path, "x"))
    assert refused == [f"{path} (Trinity-RFT {REFUSED[pattern].until}): {REFUSED[pattern].why}"]
    assert "unknown key" not in refused[0]


def test_a_refused_key_and_an_unknown_one_are_reported_together(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data_processor:\n  data_processor_url: http://x\nbuffer:\n  batch_sise: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert [p.split(" ")[0] for p in info.value.problems] == [
        "data_processor.data_processor_url",
        "buffer.batch_sise:",
    ]


def test_a_stage_is_read_like_the_whole_config(caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, _ = read(
            ("stages.0.stage_name", "a"),
            ("stages.0.synchronizer.sync_style", "dynamic_by_trainer"),
            ("stages.0.explorer.runner_num", 4),
        )
    assert data["stages"][0]["synchronizer"] == {"sync_style": "trainer_driven"}
    assert data["stages"][0]["explorer"] == {"runner_per_model": 4}
    assert {line.split(" ")[0] for line in lines(caplog)} == {
        "stages[0].explorer.runner_num",
        "stages[0].synchronizer.sync_style",
    }


def test_sft_warmup_dataset_without_steps_is_the_mix_algorithms_expert_data(caplog):
    dataset = {"name": "math_sft", "path": "/sft", "algorithm_type": "sft"}
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, refused = read(("buffer.trainer_input.sft_warmup_dataset", dataset))
    assert refused == []
    assert data["buffer"]["trainer_input"] == {
        "auxiliary_buffers": {"sft_dataset": {"name": "math_sft", "path": "/sft"}}
    }
    assert any(
        "is read as buffer.trainer_input.auxiliary_buffers.sft_dataset" in x for x in lines(caplog)
    )


def test_sft_warmup_steps_become_a_first_stage(caplog):
    dataset = {"name": "sft", "path": "/sft", "storage_type": "file"}
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        data, refused = read(
            ("algorithm.algorithm_type", "grpo"),
            ("algorithm.repeat_times", 8),
            ("algorithm.optimizer.lr", 1e-5),
            ("buffer.batch_size", 16),
            ("buffer.trainer_input.sft_warmup_steps", 10),
            ("buffer.trainer_input.sft_warmup_dataset", dataset),
        )
    assert refused == []
    warmup, rft = data["stages"]
    assert warmup == {
        "stage_name": "sft_warmup",
        "mode": "train",
        "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 1e-5}},
        # the original read batch_size * repeat_times rows a warm-up step
        "buffer": {
            "total_steps": 10,
            "train_batch_size": 128,
            "trainer_input": {"experience_buffer": dataset},
        },
    }
    assert rft == {"stage_name": "rft"} and data["buffer"]["trainer_input"] == {}
    assert any(
        x.startswith("buffer.trainer_input.sft_warmup_steps = 10 with") for x in lines(caplog)
    )


def test_sft_warmup_steps_without_a_dataset_are_refused():
    _, refused = read(("buffer.trainer_input.sft_warmup_steps", 5))
    assert refused == [
        "buffer.trainer_input.sft_warmup_steps = 5 needs buffer.trainer_input.sft_warmup_dataset, "
        "the data to warm up on"
    ]


# ---- through load_config: files, overrides, validation ------------------------------------


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_trainer_config_path_is_read_as_trainer_config(tmp_path, caplog, monkeypatch):
    verl = {"actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 3}}}
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "train.yaml").write_text(yaml.safe_dump(verl))
    config_file = write(tmp_path, BASE + "trainer: {trainer_config_path: verl/train.yaml}\n")
    # not found from here: beside the config file is tried next
    monkeypatch.chdir(tmp_path / "verl")
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = load_config(config_file)
    assert config.trainer.trainer_config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 3
    assert lines(caplog) == [
        "trainer.trainer_config_path = verl/train.yaml (Trinity-RFT 0.2.0 and earlier) is read "
        "as trainer.trainer_config (the file's veRL keys)"
    ]


def test_a_missing_trainer_config_path_names_the_key(tmp_path):
    config_file = write(tmp_path, BASE + "trainer: {trainer_config_path: nowhere.yaml}\n")
    with pytest.raises(
        ConfigError, match=r"trainer.trainer_config_path = nowhere.yaml: file not found"
    ):
        load_config(config_file)


def test_a_whole_0_1_config_loads(tmp_path, caplog, monkeypatch):
    """The shape of 0.1.1's examples: veRL keys in a separate file, old names throughout."""
    verl = """
    actor_rollout_ref:
      actor:
        ppo_mini_batch_size: 128
        use_dynamic_bsz: true
        use_kl_loss: true
        kl_loss_coef: 0.001
        kl_loss_type: low_var_kl
        entropy_coeff: 0.001
        clip_ratio: 0.2
        optim: {lr: 1e-6, beta1: 0.9, beta2: 0.95, warmup_style: constant}
      ref:
        log_prob_use_dynamic_bsz: ${actor_rollout_ref.actor.use_dynamic_bsz}
    # the 0.1.1 files set what they refer to
    algorithm:
      {gamma: 1.0, lam: 1.0, adv_estimator: grpo, kl_penalty: kl, kl_ctrl: {kl_coef: 0.001}}
    trainer: {val_before_train: false, balance_batch: true}
    custom_reward_function: {path: null, name: compute_score}
    """
    write(tmp_path, verl, "train.yaml")
    text = BASE + textwrap.dedent(
        """
        explorer:
          runner_num: 8
          rollout_model: {engine_type: vllm_async, engine_num: 2}
        synchronizer: {sync_method: checkpoint}
        trainer: {trainer_config_path: train.yaml}
        """
    )
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = load_config(write(tmp_path, text))
    assert config.explorer.runner_per_model == 4
    assert config.explorer.rollout_model.engine_type == "vllm"
    actor = config.trainer.trainer_config.actor_rollout_ref.actor
    assert actor.optim.betas == (0.9, 0.95) and actor.kl_loss_coef == 0.001
    assert not any("unknown key" in line for line in lines(caplog))
