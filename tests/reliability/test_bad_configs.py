"""The malformed-config corpus: every mistake stops `trinity run` before Ray starts.

Each case edits the small GRPO config (tiny model, arithmetic data) in one way a user could
get wrong, runs the real CLI in-process with ``init_ray`` guarded, and asserts: exit code 2,
the output names the key by its full YAML path (or the file), it is short (at most
``MAX_LINES`` lines, no traceback), and Ray was never asked to start. A few cases run as a
real ``trinity run`` subprocess with an empty ``RAY_TMPDIR``, which must stay empty.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import pytest

from tests.reliability.conftest import run_cli, write_config

MAX_LINES = 12  # header + one line per problem (+ a few for multi-line data messages)

Prepare = Callable[[Any, Dict[str, Any]], None]  # (tmp_path, config dict) -> edits in place


@dataclass
class Bad:
    """One malformed config: edits of the base config and what the message must say."""

    id: str
    expect: Sequence[str]  # substrings the output must contain (key paths, file names)
    set: Dict[str, Any] = field(default_factory=dict)  # dotted path -> new value
    drop: Sequence[str] = ()  # dotted paths to delete
    overrides: Sequence[str] = ()  # CLI overrides (a.b=c)
    prepare: Optional[Prepare] = None  # file fixtures and edits that need tmp_path
    absent: Sequence[str] = ()  # substrings that must not appear (e.g. a password)
    raw: Optional[str] = None  # write this text as the config file instead of the YAML
    max_lines: int = MAX_LINES


TASKSET = "buffer.explorer_input.taskset"
EVAL = "buffer.explorer_input.eval_tasksets.0"
ALGO = "algorithm"
RC = "algorithm.rollout_correction"


def _parent(data: Dict[str, Any], path: str, create: bool) -> tuple:
    parts = path.split(".")
    node: Any = data
    for part in parts[:-1]:
        key: Any = int(part) if part.isdigit() else part
        if create and isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    last = parts[-1]
    return node, int(last) if last.isdigit() else last


def edited(base: Dict[str, Any], case: Bad, tmp_path: Any) -> Dict[str, Any]:
    data = copy.deepcopy(base)
    for path, value in case.set.items():
        node, key = _parent(data, path, create=True)
        node[key] = value
    for path in case.drop:
        node, key = _parent(data, path, create=False)
        del node[key]
    if case.prepare is not None:
        case.prepare(tmp_path, data)
    return data


# ---- file fixtures ---------------------------------------------------------------------------
def _model_copy(tmp_path: Any, data: Dict[str, Any], drop: Sequence[str] = ()) -> str:
    target = os.path.join(str(tmp_path), "model_copy")
    shutil.copytree(data["model"]["model_path"], target)
    for name in drop:
        os.remove(os.path.join(target, name))
    data["model"]["model_path"] = target
    return target


def model_without_weights(tmp_path: Any, data: Dict[str, Any]) -> None:
    _model_copy(tmp_path, data, drop=["model.safetensors"])


def model_with_broken_config(tmp_path: Any, data: Dict[str, Any]) -> None:
    target = _model_copy(tmp_path, data)
    with open(os.path.join(target, "config.json"), "w") as f:
        f.write('{"model_type": "no_such_architecture", "hidden_size": 8}')


def model_without_chat_template(tmp_path: Any, data: Dict[str, Any]) -> None:
    target = _model_copy(tmp_path, data, drop=["chat_template.jinja"])
    with open(os.path.join(target, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    tokenizer_config.pop("chat_template", None)
    with open(os.path.join(target, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f)


def model_path_is_a_file(tmp_path: Any, data: Dict[str, Any]) -> None:
    path = os.path.join(str(tmp_path), "model.bin")
    open(path, "w").close()
    data["model"]["model_path"] = path


def empty_taskset(tmp_path: Any, data: Dict[str, Any]) -> None:
    path = os.path.join(str(tmp_path), "empty.jsonl")
    open(path, "w").close()
    data["buffer"]["explorer_input"]["taskset"]["path"] = path


def root_under_a_file(tmp_path: Any, data: Dict[str, Any]) -> None:
    path = os.path.join(str(tmp_path), "not_a_folder")
    open(path, "w").close()
    data["checkpoint_root_dir"] = os.path.join(path, "checkpoints")


def queue_path_is_a_folder(tmp_path: Any, data: Dict[str, Any]) -> None:
    folder = os.path.join(str(tmp_path), "buffer_dir")
    os.makedirs(folder)
    data["buffer"]["trainer_input"] = {
        "experience_buffer": {"name": "exp", "storage_type": "queue", "path": folder}
    }


def sft_stage(data: Dict[str, Any], sft: str, **buffer: Any) -> None:
    """Turn the config into an SFT run (mode train) on the arithmetic SFT data."""
    data["mode"] = "train"
    data["algorithm"] = {"algorithm_type": "sft"}
    data["buffer"] = {
        "batch_size": 4,
        "train_batch_size": 8,
        "total_steps": 2,
        "trainer_input": {
            "experience_buffer": {"name": "sft_data", "storage_type": "file", "path": sft}
        },
        **buffer,
    }


def sft_data(data: Dict[str, Any]) -> str:
    """The arithmetic fixture's SFT rows: they sit next to its RL rows (``tests/conftest.py``)."""
    return os.path.join(os.path.dirname(data["buffer"]["explorer_input"]["taskset"]["path"]), "sft")


CASES: List[Bad] = [
    # ---- unknown keys, at several depths, with suggestions -------------------------------
    Bad("unknown-top-key", ["projet", "did you mean 'project'"], set={"projet": "x"}),
    Bad("unknown-buffer-key", ["buffer.batchsize", "batch_size"], set={"buffer.batchsize": 4}),
    Bad(
        "unknown-taskset-key",
        ["buffer.explorer_input.tasksets[0].formatt", "did you mean 'format'"],
        set={f"{TASKSET}.formatt": {}},
    ),
    Bad(
        "unknown-format-key",
        ["buffer.explorer_input.tasksets[0].format.promt_key", "prompt_key"],
        set={f"{TASKSET}.format.promt_key": "q"},
    ),
    Bad(
        "unknown-optimizer-key",
        ["algorithm.optimizer.learning_rate"],
        set={"algorithm.optimizer.learning_rate": 1e-3},
    ),
    Bad(
        "unknown-verl-key",
        ["trainer.trainer_config.actor_rollout_ref.actor.ppo_epoch", "ppo_epochs"],
        set={"trainer.trainer_config": {"actor_rollout_ref": {"actor": {"ppo_epoch": 2}}}},
    ),
    Bad(
        "unknown-rollout-model-key",
        ["explorer.rollout_model.enginetype", "engine_type"],
        set={"explorer.rollout_model": {"enginetype": "vllm"}},
    ),
    Bad("unknown-model-key", ["model.tempreature", "temperature"], set={"model.tempreature": 1}),
    Bad(
        "moved-key",
        ["buffer.default_workflow_type", "buffer.explorer_input.default_workflow_type"],
        set={"buffer.default_workflow_type": "math_workflow"},
    ),
    Bad(
        "unknown-stage-key",
        ["stages[0].algorithmm", "algorithm"],
        set={"stages": [{"stage_name": "a", "algorithmm": {}}]},
    ),
    Bad(
        "unknown-key-by-override",
        ["synchronizer.sync_intervall", "sync_interval"],
        overrides=["synchronizer.sync_intervall=2"],
    ),
    # ---- wrong types -------------------------------------------------------------------
    Bad("batch-size-word", ["buffer.batch_size", "four"], set={"buffer.batch_size": "four"}),
    Bad(
        "save-interval-bool", ["trainer.save_interval", "true"], set={"trainer.save_interval": True}
    ),
    Bad(
        "repeat-times-bool",
        ["algorithm.repeat_times", "true"],
        set={"algorithm.repeat_times": True},
    ),
    Bad("temperature-word", ["model.temperature", "hot"], set={"model.temperature": "hot"}),
    Bad("eval-interval-list", ["explorer.eval_interval"], set={"explorer.eval_interval": [1]}),
    Bad(
        "betas-bool", ["algorithm.optimizer.betas"], set={"algorithm.optimizer.betas": [True, 0.9]}
    ),
    Bad("mode-typo", ["mode", "'both'"], set={"mode": "bot"}),
    Bad(
        "loss-agg-typo", ["algorithm.loss_agg_mode"], set={"algorithm.loss_agg_mode": "token_mean"}
    ),
    Bad("model-not-a-mapping", ["model", "a mapping"], set={"model": "./model"}),
    Bad(
        "eval-tasksets-not-a-list",
        ["buffer.explorer_input.eval_tasksets"],
        set={"buffer.explorer_input.eval_tasksets": {"name": "x"}},
    ),
    Bad("yaml-syntax", ["config.yaml", "not valid YAML"], raw="model: {model_path: [x\n"),
    Bad("yaml-top-level-list", ["config.yaml", "mapping"], raw="- mode: both\n"),
    Bad("bad-override", ["override 'buffer.batch_size'"], overrides=["buffer.batch_size"]),
    # ---- required keys missing ---------------------------------------------------------
    Bad("no-model-path", ["model.model_path is required"], drop=["model.model_path"]),
    Bad(
        "no-max-response-tokens",
        ["model.max_response_tokens is required"],
        drop=["model.max_response_tokens"],
    ),
    Bad("no-taskset", ["buffer.explorer_input.taskset is required"], drop=[TASKSET]),
    Bad("no-taskset-path", ["buffer.explorer_input.tasksets[0].path"], drop=[f"{TASKSET}.path"]),
    Bad("stage-without-name", ["stages[0].stage_name"], set={"stages": [{"mode": "train"}]}),
    Bad(
        "train-without-data",
        ["buffer.trainer_input.experience_buffer is required"],
        set={"mode": "train", "algorithm.algorithm_type": "sft"},
    ),
    # ---- impossible ranges -------------------------------------------------------------
    Bad("temperature-negative", ["model.temperature = -1"], set={"model.temperature": -1}),
    Bad(
        "top-p-above-one",
        ["buffer.explorer_input.tasksets[0].rollout_args.top_p = 2", "(0, 1]"],
        set={f"{TASKSET}.rollout_args": {"top_p": 2}},
    ),
    Bad("top-p-zero", ["model.top_p = 0"], set={"model.top_p": 0}),
    Bad("top-k-negative", ["model.top_k = -5"], set={"model.top_k": -5}),
    Bad(
        "eval-max-tokens-zero",
        ["buffer.explorer_input.eval_tasksets[0].rollout_args.max_tokens = 0"],
        set={f"{EVAL}.rollout_args.max_tokens": 0},
    ),
    Bad(
        "repetition-penalty-zero",
        ["model.repetition_penalty = 0"],
        set={"model.repetition_penalty": 0},
    ),
    Bad(
        "keep-negative-checkpoints",
        ["trainer.max_checkpoints_to_keep = -1"],
        set={"trainer.max_checkpoints_to_keep": -1},
    ),
    Bad(
        "save-interval-negative", ["trainer.save_interval = -1"], set={"trainer.save_interval": -1}
    ),
    Bad("batch-size-zero", ["buffer.batch_size = 0"], set={"buffer.batch_size": 0}),
    Bad(
        "sync-interval-zero",
        ["synchronizer.sync_interval = 0"],
        set={"synchronizer.sync_interval": 0},
    ),
    Bad(
        "warmup-ratio-above-one",
        ["algorithm.optimizer.lr_warmup_steps_ratio = 1.5"],
        set={"algorithm.optimizer.lr_warmup_steps_ratio": 1.5},
    ),
    Bad(
        "min-response-not-below-max",
        ["model.min_response_tokens = 4", "model.max_response_tokens = 4"],
        set={"model.min_response_tokens": 4},
    ),
    Bad("grad-clip-zero", ["trainer.grad_clip = 0"], set={"trainer.grad_clip": 0}),
    Bad(
        "failed-ratio-above-one",
        ["explorer.max_failed_ratio = 1.5 must be <= 1"],
        set={"explorer.max_failed_ratio": 1.5},
    ),
    Bad("no-runners", ["explorer.runner_per_model = 0"], set={"explorer.runner_per_model": 0}),
    # ---- batch arithmetic --------------------------------------------------------------
    Bad(
        "grpo-one-rollout",
        ["algorithm.repeat_times = 1", "grpo"],
        set={"algorithm.repeat_times": 1},
    ),
    Bad(
        "rloo-one-rollout",
        ["algorithm.repeat_times = 1", "rloo"],
        set={"algorithm": {"algorithm_type": "rloo", "repeat_times": 1}},
    ),
    Bad(
        "dapo-one-rollout",
        ["algorithm.repeat_times = 1", "dapo"],
        set={"algorithm": {"algorithm_type": "dapo", "repeat_times": 1}},
    ),
    Bad(
        "gspo-one-rollout",
        ["algorithm.repeat_times = 1", "gspo"],
        set={"algorithm": {"algorithm_type": "gspo", "repeat_times": 1}},
    ),
    Bad(
        "drgrpo-one-rollout",
        ["algorithm.repeat_times = 1", "drgrpo"],
        set={"algorithm": {"algorithm_type": "drgrpo", "repeat_times": 1}},
    ),
    Bad(
        "split-groups",
        ["buffer.train_batch_size = 10", "multiple of algorithm.repeat_times = 4"],
        set={"buffer.train_batch_size": 10},
    ),
    Bad(
        "train-batch-above-step-output",
        ["buffer.train_batch_size = 32", "4 * 4 = 16"],
        set={"buffer.train_batch_size": 32},
    ),
    Bad(
        "batch-larger-than-taskset",
        ["buffer.batch_size = 100", "64 rows", "buffer.explorer_input.tasksets[0]"],
        set={"buffer.batch_size": 100},
    ),
    Bad(
        "sft-batch-larger-than-data",
        ["buffer.train_batch_size = 100", "buffer.trainer_input.experience_buffer"],
        prepare=lambda tmp, data: sft_stage(
            data,
            sft_data(data),
            train_batch_size=100,
        ),
    ),
    # ---- missing or unusable files -----------------------------------------------------
    Bad(
        "model-missing",
        ["model.model_path = /nonexistent/model", "no such folder", "a hub id"],
        set={"model.model_path": "/nonexistent/model"},
        absent=["huggingface.co", "HFValidationError"],
    ),
    Bad("model-path-is-file", ["model.model_path", "not a folder"], prepare=model_path_is_a_file),
    Bad("model-without-weights", ["model.model_path", "weights"], prepare=model_without_weights),
    Bad(
        "model-config-unreadable",
        ["model.model_path", "config.json cannot be read"],
        prepare=model_with_broken_config,
    ),
    Bad(
        "model-without-chat-template",
        ["model.model_path", "chat template", "model.chat_template_path"],
        prepare=model_without_chat_template,
    ),
    Bad(
        "taskset-path-missing",
        ["buffer.explorer_input.tasksets[0]", "/nonexistent/data"],
        set={f"{TASKSET}.path": "/nonexistent/data"},
    ),
    Bad(
        "eval-split-missing",
        ["buffer.explorer_input.eval_tasksets[0]", "validation", "splits found"],
        set={f"{EVAL}.split": "validation"},
    ),
    Bad(
        "taskset-column-missing",
        ["buffer.explorer_input.tasksets[0]", "problem"],
        set={f"{TASKSET}.format.prompt_key": "problem"},
    ),
    Bad(
        "workflow-column-missing",
        ["buffer.explorer_input.tasksets[0]", "math_workflow", "format.prompt_key = prompt"],
        drop=[f"{TASKSET}.format"],
    ),
    Bad(
        "chat-template-file-missing",
        ["model.chat_template_path = /nonexistent/template.jinja"],
        set={"model.chat_template_path": "/nonexistent/template.jinja"},
    ),
    Bad("empty-taskset", ["buffer.explorer_input.tasksets[0]", "empty"], prepare=empty_taskset),
    Bad(
        "sft-response-column-missing",
        ["buffer.trainer_input.experience_buffer", "answer_text"],
        prepare=lambda tmp, data: (
            sft_stage(data, sft_data(data)),
            data["buffer"]["trainer_input"]["experience_buffer"].update(
                {"format": {"response_key": "answer_text"}}
            ),
        ),
    ),
    Bad(
        "expert-data-missing",
        ["buffer.trainer_input.auxiliary_buffers.sft_dataset", "/nonexistent/sft"],
        set={
            "algorithm": {"algorithm_type": "mix", "repeat_times": 4},
            "buffer.train_batch_size": 16,
            "buffer.trainer_input.auxiliary_buffers": {
                "sft_dataset": {"storage_type": "file", "path": "/nonexistent/sft"}
            },
        },
    ),
    Bad("root-under-a-file", ["checkpoint_root_dir", "is a file"], prepare=root_under_a_file),
    # ---- names -------------------------------------------------------------------------
    Bad(
        "workflow-typo",
        [
            "buffer.explorer_input.default_workflow_type = math_workflw",
            "did you mean 'math_workflow'?",
            "loaded with --plugin-dir, or it is named by its dotted path (module.Class)",
        ],
        set={"buffer.explorer_input.default_workflow_type": "math_workflw"},
    ),
    Bad(
        "workflow-unknown",  # nothing close: the known names and how a plugin's gets here
        [
            "buffer.explorer_input.default_workflow_type = openai_mat",
            "(known: async_math_boxed_workflow, ",
            "loaded with --plugin-dir, or it is named by its dotted path (module.Class)",
        ],
        absent=["did you mean"],
        set={"buffer.explorer_input.default_workflow_type": "openai_mat"},
    ),
    Bad(
        "eval-workflow-typo",
        ["buffer.explorer_input.eval_tasksets[0].default_workflow_type = simple_flow"],
        set={f"{EVAL}.default_workflow_type": "simple_flow"},
    ),
    Bad(
        "reward-typo",
        [
            "buffer.explorer_input.default_reward_fn_type = math_rewrd",
            "did you mean 'math_reward'?",
            "loaded with --plugin-dir, or it is named by its dotted path (module.Class)",
        ],
        set={"buffer.explorer_input.default_reward_fn_type": "math_rewrd"},
    ),
    Bad(
        "originals-environment-workflow",
        [
            "buffer.explorer_input.default_workflow_type = alfworld_workflow: the original's "
            "ALFWorld workflow needs the alfworld environment package",
            "not supported yet",
        ],
        set={"buffer.explorer_input.default_workflow_type": "alfworld_workflow"},
    ),
    Bad(
        "originals-rm-gallery-reward",
        [
            "buffer.explorer_input.default_reward_fn_type = rm_gallery_reward",
            "rm-gallery package",
            "not supported yet",
        ],
        set={"buffer.explorer_input.default_reward_fn_type": "rm_gallery_reward"},
    ),
    Bad(
        "workflow-without-reward",
        ["buffer.explorer_input.default_reward_fn_type is not set", "simple_workflow"],
        set={"buffer.explorer_input.default_workflow_type": "simple_workflow"},
    ),
    Bad(
        "reward-is-not-a-reward",
        ["buffer.explorer_input.default_reward_fn_type = subprocess.Popen", "RewardFn"],
        set={"buffer.explorer_input.default_reward_fn_type": "subprocess.Popen"},
    ),
    Bad(
        "algorithm-typo",
        # a name documented nowhere is unknown, not a planned feature ("not supported yet")
        [
            "algorithm.algorithm_type: unknown algorithm_type 'grop'",
            "did you mean 'grpo'?",
            "a plugin's class is registered once its file is loaded with --plugin-dir",
        ],
        absent=["not supported"],
        set={"algorithm.algorithm_type": "grop"},
    ),
    Bad(
        "advantage-unknown",
        ["algorithm.advantage_fn = gae", "no module named 'gae'"],
        set={"algorithm.advantage_fn": "gae"},
    ),
    Bad(
        "policy-loss-typo",
        ["algorithm.policy_loss_fn = ppp", "did you mean 'ppo'"],
        set={"algorithm.policy_loss_fn": "ppp"},
    ),
    Bad("name-escapes-root", ["name", "not a valid name"], set={"name": "../../../x"}),
    Bad("project-with-slash", ["project", "not a valid name"], set={"project": "a/b"}),
    Bad(
        "stage-name-with-slash",
        ["stages[0].stage_name", "not a valid name"],
        set={"stages": [{"stage_name": "../up"}]},
    ),
    Bad(
        "trainer-name-hidden", ["trainer.name", "not a valid name"], set={"trainer.name": ".hidden"}
    ),
    Bad(
        "taskset-name-with-space",
        ["buffer.explorer_input.tasksets[0].name", "not a valid name"],
        set={f"{TASKSET}.name": "arith train"},
    ),
    # ---- component arguments bound against their constructors --------------------------
    Bad(
        "policy-loss-arg-typo",
        ["algorithm.policy_loss_fn_args.clip_rang", "did you mean 'clip_range'"],
        set={"algorithm.policy_loss_fn_args": {"clip_rang": 0.3}},
    ),
    Bad(
        "sample-strategy-arg-typo",
        ["algorithm.sample_strategy_args.timeuot", "did you mean 'timeout'"],
        set={"algorithm.sample_strategy_args": {"timeuot": 3}},
    ),
    Bad(
        "advantage-arg-typo",
        ["algorithm.advantage_fn_args.norm_adv_by_std", "norm_adv_by_std_in_grpo"],
        set={"algorithm.advantage_fn_args": {"norm_adv_by_std": False}},
    ),
    Bad(
        "kl-loss-arg-typo",
        ["algorithm.kl_loss_fn_args.kl_coeff", "did you mean 'kl_coef'"],
        set={"algorithm.kl_loss_fn_args": {"kl_coeff": 0.1}},
    ),
    Bad(
        "kl-ctrl-key-typo",
        ["algorithm.kl_penalty_fn_args.kl_ctrl.target_k", "target_kl"],
        set={"algorithm.kl_penalty_fn_args": {"kl_ctrl": {"type": "adaptive", "target_k": 6}}},
    ),
    Bad(
        "entropy-arg-typo",
        ["algorithm.entropy_loss_fn_args.entropy_coeff", "entropy_coef"],
        set={"algorithm.entropy_loss_fn_args": {"entropy_coeff": 0.01}},
    ),
    Bad(
        "reward-takes-no-args",
        ["buffer.explorer_input.tasksets[0].reward_fn_args.scale", "math_reward"],
        set={f"{TASKSET}.reward_fn_args": {"scale": 2}},
    ),
    Bad(
        "reward-arg-typo",
        ["buffer.explorer_input.tasksets[0].reward_fn_args.format_scor", "format_score"],
        set={
            f"{TASKSET}.default_reward_fn_type": "countdown_reward",
            f"{TASKSET}.reward_fn_args": {"format_scor": 0.2},
        },
    ),
    Bad(
        "opmd-tau-out-of-range",
        ["algorithm.policy_loss_fn_args", "tau must be > -1"],
        set={"algorithm": {"algorithm_type": "opmd", "repeat_times": 4}},
        overrides=["algorithm.policy_loss_fn_args.tau=-2"],
    ),
    Bad(
        "mix-without-expert-buffer",
        ["algorithm.sample_strategy_args", "buffer.trainer_input.auxiliary_buffers.sft_dataset"],
        set={
            "algorithm": {"algorithm_type": "mix", "repeat_times": 4},
            "buffer.train_batch_size": 16,
        },
    ),
    Bad(
        "chord-without-expert-buffer",
        ["algorithm.sample_strategy_args", "buffer.trainer_input.auxiliary_buffers.sft_dataset"],
        set={
            "algorithm": {"algorithm_type": "mix_chord", "repeat_times": 4},
            "buffer.train_batch_size": 16,
        },
    ),
    Bad(
        "jsd-without-teacher",
        ["algorithm.algorithm_type = jsd", "explorer.auxiliary_models[0].model_path"],
        set={"algorithm": {"algorithm_type": "jsd", "repeat_times": 1}},
    ),
    Bad(
        "staleness-mode-typo",
        ["algorithm.sample_strategy_args", "staleness_control mode"],
        set={
            "algorithm.sample_strategy": "staleness_control",
            "algorithm.sample_strategy_args": {"mode": "dropp"},
        },
    ),
    Bad(
        "sft-with-kl-loss",
        ["algorithm.algorithm_type = sft", "kl_loss_fn: k2"],
        prepare=lambda tmp, data: (
            sft_stage(data, sft_data(data)),
            data["algorithm"].update({"kl_loss_fn": "k2"}),
        ),
    ),
    Bad(
        "workflow-arg-typo",
        ["buffer.explorer_input.tasksets[0].workflow_args.greedy_baselin", "greedy_baseline"],
        set={f"{TASKSET}.workflow_args": {"greedy_baselin": True}},
    ),
    Bad(
        "remax-without-greedy-baseline",
        ["buffer.explorer_input.tasksets[0].workflow_args.greedy_baseline must be true", "remax"],
        set={"algorithm": {"algorithm_type": "remax", "repeat_times": 1}},
    ),
    Bad(
        "gigpo-without-turn-states",
        ["buffer.explorer_input.default_workflow_type = math_workflow", "advantage_fn gigpo"],
        set={"algorithm": {"algorithm_type": "gigpo", "repeat_times": 2}},
    ),
    Bad(
        "ruler-without-a-judge",
        ["buffer.explorer_input.default_workflow_type = ruler_workflow needs a judge"],
        set={"buffer.explorer_input.default_workflow_type": "ruler_workflow"},
    ),
    Bad(
        "ruler-group-split-across-runners",
        ["explorer.max_repeat_times_per_runner = 1 splits the 4 answers", "ruler_workflow"],
        set={
            "buffer.explorer_input.default_workflow_type": "ruler_workflow",
            "explorer.max_repeat_times_per_runner": 1,
            "explorer.auxiliary_models": [{"model_path": "."}],
        },
        prepare=lambda tmp, data: data["explorer"]["auxiliary_models"][0].update(
            model_path=data["model"]["model_path"]
        ),
    ),
    Bad(
        "rubric-criterion-typo",
        [
            "buffer.explorer_input.tasksets[0].workflow_args.rubric[0].wieght",
            "did you mean 'weight'",
        ],
        set={
            "buffer.explorer_input.default_workflow_type": "rubric_workflow",
            f"{TASKSET}.workflow_args": {
                "rubric": [{"name": "a", "description": "b", "wieght": 2}]
            },
        },
    ),
    # ---- buffer paths ------------------------------------------------------------------
    Bad(
        "postgres-buffer",
        # a server checked before start: here, one that does not exist
        [
            "buffer.trainer_input.experience_buffer.path",
            "cannot connect to database postgresql://u:***@host/db",
        ],
        set={
            "buffer.trainer_input": {
                "experience_buffer": {
                    "name": "exp",
                    "storage_type": "queue",
                    "path": "postgresql://u:secret@host/db",
                }
            }
        },
        absent=["secret"],
    ),
    Bad(
        "mysql-buffer",
        ["buffer.trainer_input.experience_buffer.path", "mysql://", "driver is not installed"],
        set={
            "buffer.trainer_input": {
                "experience_buffer": {"storage_type": "queue", "path": "mysql://root@localhost/x"}
            }
        },
    ),
    Bad(
        "queue-path-is-folder",
        ["buffer.trainer_input.experience_buffer.path", "a folder"],
        prepare=queue_path_is_a_folder,
    ),
    # ---- stages and features not built -------------------------------------------------
    Bad(
        "stage-hands-over-no-export",
        ["stage 'first'", "trainer.save_hf_checkpoint = never"],
        set={
            "stages": [
                {"stage_name": "first", "trainer": {"save_hf_checkpoint": "never"}},
                {"stage_name": "second"},
            ]
        },
    ),
    Bad(
        "duplicate-stage-names",
        ["stages", "stage_name must be unique"],
        set={"stages": [{"stage_name": "a"}, {"stage_name": "a"}]},
    ),
    Bad(
        "a-stage-value-out-of-its-bounds",
        ["stages[1].buffer.batch_size = 0 must be >= 1"],
        set={"stages": [{"stage_name": "one"}, {"stage_name": "two", "buffer": {"batch_size": 0}}]},
    ),
    Bad(
        "problems-in-two-stages",
        [
            "stage 'one': algorithm.repeat_times = 1",
            "stage 'two': buffer.train_batch_size = 3 is not a multiple",
            "stages 'one', 'two': model.temperature = -1",  # shared: said once
        ],
        set={
            "stages": [
                {"stage_name": "one", "algorithm": {"repeat_times": 1}},
                {"stage_name": "two", "buffer": {"train_batch_size": 3}},
            ],
            "model.temperature": -1,
        },
    ),
    Bad(
        "many-problems-at-once",
        [
            "model.model_path = /nonexistent/model",
            "buffer.explorer_input.tasksets[0]",
            "model.temperature = -1",
            "algorithm.policy_loss_fn_args.clip_rang",
            "buffer.explorer_input.default_workflow_type = math_workflw",
        ],
        set={
            "model.model_path": "/nonexistent/model",
            f"{TASKSET}.path": "/nonexistent/data",
            "model.temperature": -1,
            "algorithm.policy_loss_fn_args": {"clip_rang": 0.3},
            "buffer.explorer_input.default_workflow_type": "math_workflw",
        },
    ),
    Bad(
        "monitor-not-built",
        ["monitor.monitor_type: unknown monitor_type 'neptune'", "mlflow, tensorboard, wandb"],
        set={"monitor.monitor_type": "neptune"},
    ),
    Bad(
        "monitor-arg-typo",
        ["monitor.monitor_args.api_keys", "did you mean 'api_key'"],
        set={"monitor.monitor_type": "wandb", "monitor.monitor_args": {"api_keys": "k"}},
    ),
    Bad(
        "mlflow-server-down",  # port 9 (discard): nothing listens there
        ["monitor.monitor_args.uri = http://127.0.0.1:9", "no MLflow tracking server answers"],
        set={
            "monitor.monitor_type": "mlflow",
            "monitor.monitor_args": {"uri": "http://127.0.0.1:9"},
        },
    ),
    Bad(
        "sql-taskset-not-a-database",  # the data folder is no SQLite database: named before Ray
        ["buffer.explorer_input.tasksets[0]", "table 'arith_train'", "unable to open database"],
        set={f"{TASKSET}.storage_type": "sql"},
    ),
    Bad(
        "concurrent-mode-unknown",
        ["explorer.concurrent_mode", "multithreading", "multi-threading"],
        set={"explorer.concurrent_mode": "multithreading"},
    ),
    # ---- external models ---------------------------------------------------------------
    Bad(
        "external-rollout-trained",
        ["model.external_model.enable", "cannot be trained", "use mode: explore"],
        set={"model.external_model": {"enable": True}},
    ),
    Bad(
        "external-judge-url-unset",
        [
            "explorer.auxiliary_models[0].external_model.base_url_env = TRINITY_NO_SUCH_URL",
            "TRINITY_NO_SUCH_URL is not set",
        ],
        set={
            "explorer.auxiliary_models": [
                {
                    "engine_type": "external",
                    "model_path": "judge",
                    "external_model": {"base_url_env": "TRINITY_NO_SUCH_URL"},
                }
            ]
        },
    ),
    Bad(
        "external-judge-two-engines",
        ["explorer.auxiliary_models[0].external_model.enable = true contradicts"],
        set={
            "explorer.auxiliary_models": [
                {
                    "engine_type": "transformers",
                    "model_path": "j",
                    "external_model": {"enable": True},
                }
            ]
        },
    ),
    # ---- trainer ranks (trainer.cpu_ranks) ---------------------------------------------
    Bad("cpu-ranks-zero", ["trainer.cpu_ranks = 0 must be >= 1"], set={"trainer.cpu_ranks": 0}),
    Bad(  # on a machine without GPUs: the GPUs are the problem, CPU ranks then run
        "cpu-ranks-with-gpus-this-machine-lacks",
        [
            "cluster.gpu_per_node = 8 but this machine has 0 GPU(s)",
            "to run it here: trinity run --config ",
            " cluster.gpu_per_node=0",
        ],
        set={"trainer.cpu_ranks": 2, "cluster.gpu_per_node": 8},
        absent=["trainer.cpu_ranks = 2 with"],
    ),
    Bad(
        "cpu-ranks-split-batch",
        ["buffer.train_batch_size = 16 is not a multiple of 3", "trainer.cpu_ranks = 3"],
        set={"trainer.cpu_ranks": 3},
    ),
    Bad(
        "cpu-ranks-critic",
        ["algorithm.algorithm_type = ppo trains a critic", "trainer.cpu_ranks = 2"],
        set={"trainer.cpu_ranks": 2, "algorithm.algorithm_type": "ppo"},
    ),
    # ---- nodes (cluster.node_num) -------------------------------------------------------
    Bad(  # no Ray cluster to join, no GPUs: both said at once, with the overrides
        "nodes-and-gpus-this-machine-lacks",
        [
            "cluster.node_num = 2 needs a Ray cluster of 2 nodes, but RAY_ADDRESS is not set",
            "cluster.gpu_per_node = 8 but this machine has 0 GPU(s)",
            " cluster.node_num=1 cluster.gpu_per_node=0",
        ],
        set={"cluster.node_num": 2, "cluster.gpu_per_node": 8},
    ),
    Bad(
        "nodes-without-a-cluster",
        ["cluster.node_num = 3 needs a Ray cluster of 3 nodes", " cluster.node_num=1"],
        set={"cluster.node_num": 3},
    ),
    # ---- data pipelines (data_processor, service.data_juicer) ---------------------------
    Bad(
        "pipeline-unknown-operator",
        [
            "data_processor.experience_pipeline.operators[0].name = reward_filtr",
            "did you mean 'reward_filter'?",
        ],
        set={"data_processor.experience_pipeline.operators": [{"name": "reward_filtr"}]},
    ),
    Bad(
        "pipeline-unknown-argument",
        ["data_processor.task_pipeline.operators[0].args.max_len", "did you mean 'max_length'?"],
        set={
            "data_processor.task_pipeline.operators": [
                {"name": "length_filter", "args": {"max_len": 30}}
            ]
        },
    ),
    Bad(
        "pipeline-bad-bounds",
        [
            "data_processor.experience_pipeline.operators[0].args: min_reward, max_reward: the "
            "minimum 1 is above the maximum 0"
        ],
        set={
            "data_processor.experience_pipeline.operators": [
                {"name": "reward_filter", "args": {"min_reward": 1, "max_reward": 0}}
            ]
        },
    ),
    Bad(
        "data-juicer-service-without-url",
        ["service.data_juicer.server_url is not set"],
        set={"service.data_juicer": {"auto_start": False}},
    ),
    # ---- rollout correction ------------------------------------------------------------------
    Bad(
        "rollout-rs-without-threshold",
        [f"{RC}.rollout_rs_threshold: required with rollout_rs = geometric"],
        set={RC: {"rollout_rs": "geometric"}},
    ),
    Bad(
        "rollout-rs-threshold-without-rs",
        [f"{RC}.rollout_rs_threshold: 2.0 has no effect while rollout_rs is null"],
        set={RC: {"rollout_rs_threshold": 2.0}},
    ),
    Bad(
        "rollout-is-threshold-below-one",
        [f"{RC}.rollout_is_threshold = 0.5 must be >= 1.0"],
        set={RC: {"rollout_is": "token", "rollout_is_threshold": 0.5}},
    ),
    Bad(
        "rollout-is-level-typo",
        [f"{RC}.rollout_is", "did you mean 'sequence'?"],
        set={RC: {"rollout_is": "sequense"}},
    ),
    Bad(
        "rollout-correction-key-typo",
        [f"{RC}.rollout_is_treshold", "did you mean 'rollout_is_threshold'?"],
        set={RC: {"rollout_is_treshold": 2.0}},
    ),
    Bad(
        "rollout-correction-bypass-mode",
        [f"{RC}.bypass_mode = true is not supported yet"],
        set={RC: {"bypass_mode": True}},
    ),
    Bad(
        "rollout-correction-on-sft",
        [f"{RC}.rollout_is = token: algorithm_type sft trains on data"],
        prepare=lambda tmp_path, data: sft_stage(data, sft_data(data)),
        overrides=[f"{RC}.rollout_is=token"],
    ),
    Bad(
        "rollout-is-with-a-loss-without-weights",
        [f"{RC}.rollout_is = sequence is not supported yet with policy_loss_fn sft"],
        set={ALGO: {"policy_loss_fn": "sft", "rollout_correction": {"rollout_is": "sequence"}}},
    ),
]


@pytest.fixture(scope="module")
def warm(tmp_path_factory, micro_model, arithmetic_data) -> None:
    """Import what the checks import once, so each case's time is its own checks."""
    import trinity.preflight.before_start  # noqa: F401
    from trinity.buffer.file_reader import load_rows  # noqa: F401


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_config_stops_before_ray(case, base_config, tmp_path, ray_guard, warm):
    path = os.path.join(str(tmp_path), "config.yaml")
    if case.raw is not None:
        with open(path, "w") as f:
            f.write(case.raw)
    else:
        path = write_config(tmp_path, edited(base_config, case, tmp_path))
    run = run_cli(["run", "--config", path, *case.overrides])
    assert run.exit_code == 2, f"exit {run.exit_code}: {run.exception!r}\n{run.output}"
    assert not ray_guard, "Ray was asked to start"
    for text in case.expect:
        assert text in run.output, f"{text!r} not in:\n{run.output}"
    for text in case.absent:
        assert text not in run.output, f"{text!r} leaked into:\n{run.output}"
    lines = run.output.strip().splitlines()
    assert "Traceback" not in run.output and len(lines) <= case.max_lines, run.output


def test_corpus_is_large_enough():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


SUBPROCESS_CASES = ["model-missing", "postgres-buffer", "policy-loss-arg-typo"]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_bad_config_as_a_real_command_starts_no_ray(case_id, base_config, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    path = write_config(tmp_path, edited(base_config, case, tmp_path))
    ray_tmp = tmp_path / "ray_tmp"
    ray_tmp.mkdir()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": ""}
    out = subprocess.run(
        [sys.executable, "-m", "trinity.cli.main", "run", "--config", path, *case.overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    for text in case.expect:
        assert text in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert os.listdir(ray_tmp) == [], "Ray wrote its session folder"
