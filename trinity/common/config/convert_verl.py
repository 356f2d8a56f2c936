"""``trinity convert-verl``: a veRL command line or YAML -> the equivalent Trinity YAML.

The mapping (docs/reference/verl.md, generated from this module): ``TABLE`` maps a veRL key to the
Trinity key that holds the same setting; the rows that need arithmetic or a choice (the
advantage estimator, KL switches, data files, batch sizes, the logger, resume) are the
functions in ``SPECIAL``. Any other veRL key that ``trainer.trainer_config`` declares (the
veRL tree the native trainer reads) is copied there, unless it is declared there only so veRL
files load (``inert``: nothing reads it). Everything else is returned as "not mapped", with
the reason, so nothing a user wrote disappears silently.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any, Callable, Dict, List, Optional, Tuple, get_origin

import yaml
from pydantic import BaseModel

from trinity.common.config.schema_algorithm import RolloutCorrectionConfig
from trinity.common.config.verl import VerlOptimConfig, VerlTrainerConfig
from trinity.common.config.verl_mapping import KL_NAMES

_ACTOR = "actor_rollout_ref.actor"
_CORRECTION = "algorithm.rollout_correction"
_ROLLOUT = "actor_rollout_ref.rollout"

# veRL key -> Trinity key, one row each (docs/reference/verl.md lists them)
TABLE: Dict[str, str] = {
    "algorithm.gamma": "algorithm.advantage_fn_args.gamma",
    "algorithm.lam": "algorithm.advantage_fn_args.lam",
    "algorithm.kl_ctrl.kl_coef": "algorithm.kl_penalty_fn_args.kl_coef",
    "data.max_prompt_length": "model.max_prompt_tokens",
    "data.max_response_length": "model.max_response_tokens",
    "actor_rollout_ref.model.path": "model.model_path",
    f"{_ACTOR}.use_dynamic_bsz": "trainer.use_dynamic_bsz",
    f"{_ACTOR}.ppo_max_token_len_per_gpu": "trainer.max_token_len_per_gpu",
    f"{_ACTOR}.ulysses_sequence_parallel_size": "trainer.ulysses_sequence_parallel_size",
    f"{_ACTOR}.grad_clip": "trainer.grad_clip",
    f"{_ACTOR}.kl_loss_coef": "algorithm.kl_loss_fn_args.kl_coef",
    f"{_ACTOR}.entropy_coeff": "algorithm.entropy_loss_fn_args.entropy_coef",
    f"{_ACTOR}.clip_ratio": "algorithm.policy_loss_fn_args.clip_range",
    f"{_ACTOR}.loss_agg_mode": "algorithm.loss_agg_mode",
    f"{_ROLLOUT}.gpu_memory_utilization": "explorer.rollout_model.gpu_memory_utilization",
    f"{_ROLLOUT}.temperature": "model.temperature",
    f"{_ROLLOUT}.top_p": "model.top_p",
    f"{_ROLLOUT}.top_k": "model.top_k",
    f"{_ROLLOUT}.tensor_model_parallel_size": "explorer.rollout_model.tensor_parallel_size",
    "critic.model.path": "model.critic_model_path",
    "trainer.project_name": "project",
    "trainer.experiment_name": "name",
    "trainer.default_local_dir": "checkpoint_root_dir",
    "trainer.n_gpus_per_node": "cluster.gpu_per_node",
    "trainer.nnodes": "cluster.node_num",
    "trainer.save_freq": "trainer.save_interval",
    "trainer.test_freq": "explorer.eval_interval",
    "trainer.total_epochs": "buffer.total_epochs",
    "trainer.total_training_steps": "buffer.total_steps",
    "trainer.critic_warmup": "trainer.trainer_config.trainer.critic_warmup",
    "trainer.val_before_train": "explorer.eval_on_startup",
    # the same section under the same name (bypass_mode: refused as not supported yet)
    **{
        f"{_CORRECTION}.{key}": f"{_CORRECTION}.{key}"
        for key in RolloutCorrectionConfig.model_fields
    },
}

# veRL adv_estimator -> (algorithm.algorithm_type, algorithm.advantage_fn)
ESTIMATORS: Dict[str, Tuple[str, str]] = {
    "gae": ("ppo", "ppo"),
    "grpo": ("grpo", "grpo"),
    "rloo": ("rloo", "rloo"),
    "remax": ("remax", "remax"),
    "reinforce_plus_plus": ("reinforceplusplus", "reinforceplusplus"),
    "reinforce_plus_plus_baseline": ("reinforceplusplus", "reinforceplusplus_baseline"),
}

# actor_rollout_ref.rollout.name -> explorer.rollout_model.engine_type
ENGINES = {"vllm": "vllm", "hf": "transformers"}
# veRL's default data.max_prompt_length, the bound of filter_overlong_prompts when unset
VERL_MAX_PROMPT_LENGTH = 512


class Conversion:
    """The Trinity keys set so far (dotted -> value) and the veRL keys left unmapped."""

    def __init__(self, verl: Dict[str, Any]) -> None:
        self.verl = verl
        self.out: Dict[str, Any] = {}
        self.unmapped: List[str] = []
        self.used: set = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.verl.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.out[key] = value

    def skip(self, key: str, why: str) -> None:
        self.unmapped.append(f"{key}={_show(self.verl[key])}: {why}")


def _algorithm(c: Conversion) -> None:
    estimator = c.get("algorithm.adv_estimator")
    if estimator is not None:
        if estimator in ESTIMATORS:
            algorithm_type, advantage = ESTIMATORS[estimator]
            c.set("algorithm.algorithm_type", algorithm_type)
            c.set("algorithm.advantage_fn", advantage)
        else:
            c.skip("algorithm.adv_estimator", "no Trinity advantage function of that name")
    in_reward = c.get("algorithm.use_kl_in_reward")
    penalty = c.get("algorithm.kl_penalty", "kl")
    if in_reward is not None:
        c.set("algorithm.kl_penalty_fn", _kl_name(c, "algorithm.kl_penalty", penalty, in_reward))
    use_loss = c.get(f"{_ACTOR}.use_kl_loss")
    loss_type = c.get(f"{_ACTOR}.kl_loss_type", "low_var_kl")
    if use_loss is not None:
        c.set("algorithm.kl_loss_fn", _kl_name(c, f"{_ACTOR}.kl_loss_type", loss_type, use_loss))


def _kl_name(c: Conversion, key: str, name: str, enabled: bool) -> str:
    if not enabled:
        return "none"
    if name not in KL_NAMES:
        c.skip(key, "no Trinity KL function of that name; k1 used")
    return KL_NAMES.get(name, "k1")


def _optimizer(c: Conversion) -> None:
    prefix = f"{_ACTOR}.optim."
    for key in [k for k in c.verl if k.startswith(prefix)]:
        name = key[len(prefix) :]
        c.used.add(key)
        if name == "total_training_steps":
            c.skip(key, "derived from buffer.total_steps")
        elif name in VerlOptimConfig.model_fields:
            c.set(f"algorithm.optimizer.{name}", c.verl[key])
        else:
            c.skip(key, "not an optimizer key")


def _data(c: Conversion) -> None:
    formats = {
        "prompt_key": c.get("data.prompt_key"),
        "response_key": c.get("data.response_key"),
    }
    shuffle = c.get("data.shuffle")
    for key, out, suffix in (
        ("data.train_files", "buffer.explorer_input.tasksets", ""),
        ("data.val_files", "buffer.explorer_input.eval_tasksets", "_eval"),
    ):
        files = c.get(key)
        if files is None:
            continue
        sets = []
        for path in [files] if isinstance(files, str) else list(files):
            name = os.path.basename(os.path.dirname(path)) or "data"
            entry = {"name": f"{name}{suffix}", "storage_type": "file", "path": path}
            entry["format"] = {k: v for k, v in formats.items() if v is not None}
            if shuffle and not suffix:
                entry["task_selector"] = {"selector_type": "shuffle"}
            sets.append({k: v for k, v in entry.items() if v != {}})
        _unique_names(sets)
        c.set(out, sets)
    _val_kwargs(c)
    _overlong_prompts(c)


def _overlong_prompts(c: Conversion) -> None:
    """veRL drops a prompt longer than ``max_prompt_length`` (chat template applied) when the
    dataset loads (``filter_overlong_prompts``): here the task pipeline's ``length_filter``
    does, measured the same way. ``truncation`` then never applies; without the filter,
    ``left`` is what ``enable_prompt_truncation`` does (the last tokens are kept)."""
    drop = bool(c.get("data.filter_overlong_prompts", False))
    if drop:
        limit = c.verl.get("data.max_prompt_length", VERL_MAX_PROMPT_LENGTH)
        args = {"max_length": limit, "unit": "tokens", "chat_template": True}
        c.set("data_processor.task_pipeline.operators", [{"name": "length_filter", "args": args}])
    truncation = c.get("data.truncation")
    if truncation is None or drop:
        return
    if truncation == "left":
        c.set("model.enable_prompt_truncation", True)
    else:
        c.skip(
            "data.truncation",
            "here a prompt over model.max_prompt_tokens keeps its last tokens (veRL's left); "
            "data.filter_overlong_prompts=True drops such prompts instead",
        )


def _engine(c: Conversion) -> None:
    name = c.get(f"{_ROLLOUT}.name")
    if name is None:
        return
    if name in ENGINES:
        c.set("explorer.rollout_model.engine_type", ENGINES[name])
    else:
        c.skip(f"{_ROLLOUT}.name", f"no {name} engine here: vllm or hf (transformers)")


def _val_kwargs(c: Conversion) -> None:
    """``rollout.val_kwargs``: the eval tasksets' own sampling (``n``: their repeat_times)."""
    prefix = f"{_ROLLOUT}.val_kwargs."
    evals = c.out.get("buffer.explorer_input.eval_tasksets", [])
    for key in [k for k in c.verl if k.startswith(prefix)]:
        name, value = key[len(prefix) :], c.get(key)
        if not evals:
            c.skip(key, "no data.val_files to apply it to")
        elif name in ("temperature", "top_p", "top_k"):
            for entry in evals:
                entry.setdefault("rollout_args", {})[name] = value
        elif name == "n":
            for entry in evals:
                entry["repeat_times"] = value
        else:
            c.skip(key, "no per-taskset sampling key of that name")


def _unique_names(sets: List[Dict[str, Any]]) -> None:
    """Two files in one folder would give one name twice: number the repeats."""
    seen: Dict[str, int] = {}
    for entry in sets:
        count = seen[entry["name"]] = seen.get(entry["name"], 0) + 1
        if count > 1:
            entry["name"] = f"{entry['name']}_{count}"


def _batches(c: Conversion) -> None:
    """veRL's schedule: batch_size = ppo_mini_batch_size, train_batch_size = that x n,
    sync_interval = data.train_batch_size / ppo_mini_batch_size; fixed sync, offset 0."""
    mini = c.get(f"{_ACTOR}.ppo_mini_batch_size")
    n = c.get(f"{_ROLLOUT}.n", 1)
    tasks = c.get("data.train_batch_size")
    if f"{_ROLLOUT}.n" in c.verl or mini is not None:  # veRL's n defaults to 1
        c.set("algorithm.repeat_times", n)
    if mini is not None:
        c.set("buffer.batch_size", mini)
        c.set("buffer.train_batch_size", mini * n)
    if tasks is not None:
        if mini and tasks % mini == 0:
            c.set("synchronizer.sync_interval", tasks // mini)
        else:
            c.skip("data.train_batch_size", "not a multiple of ppo_mini_batch_size")
    c.set("synchronizer.sync_style", "fixed")
    c.set("synchronizer.sync_offset", 0)


def _trainer(c: Conversion) -> None:
    loggers = c.get("trainer.logger")
    if loggers is not None:
        chosen = [x for x in ([loggers] if isinstance(loggers, str) else loggers) if x != "console"]
        if chosen:
            c.set("monitor.monitor_type", chosen[0])
        if len(chosen) > 1:
            c.skip("trainer.logger", f"one monitor per run: {chosen[0]} kept")
    resume = c.get("trainer.resume_mode")
    if resume is not None:
        c.set("continue_from_checkpoint", resume != "disable")
    if c.get("reward_model.enable"):
        c.set("explorer.auxiliary_models", [{"model_path": c.get("reward_model.model.path")}])


SPECIAL: List[Callable[[Conversion], None]] = [
    _algorithm,
    _optimizer,
    _data,
    _batches,
    _engine,
    _trainer,
]


def convert(verl: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """veRL keys (dotted -> value) -> (Trinity config as a nested dict, "key=value: why"
    for every veRL key that was not mapped)."""
    c = Conversion(verl)
    for rule in SPECIAL:
        rule(c)
    for key, value in verl.items():
        if key in c.used:
            continue
        known, inert = _trainer_config_key(key.split("."))
        if key in TABLE:
            c.set(TABLE[key], value)
        elif inert is not None:  # declared so veRL files load, but nothing reads it here
            c.skip(key, inert)
        elif known:
            c.set(f"trainer.trainer_config.{key}", value)
        elif key.startswith("reward_model."):
            c.skip(key, "a reward model is explorer.auxiliary_models[0]; set its keys there")
        else:
            c.skip(key, "no Trinity key holds it")
    return _nest(c.out), c.unmapped


def _trainer_config_key(parts: List[str]) -> Tuple[bool, Optional[str]]:
    """Whether ``trainer.trainer_config.<parts>`` is a key of the veRL tree (not moved), and
    why it has no effect when it (or a section above it) is declared ``inert``."""
    model: Any = VerlTrainerConfig
    reason: Optional[str] = None
    for part in parts:
        if get_origin(model) is dict:  # a free-form mapping (e.g. override_config) takes any key
            return True, reason
        if not _is_section(model) or part in model.MOVED_KEYS or part not in model.model_fields:
            return False, None
        field = model.model_fields[part]
        reason = reason or (field.json_schema_extra or {}).get("inert")
        model = field.annotation
    known = not _is_section(model)
    return known, reason if known else None


def _is_section(model: Any) -> bool:
    return isinstance(model, type) and issubclass(model, BaseModel)


def _nest(flat: Dict[str, Any]) -> Dict[str, Any]:
    order = ["project", "name", "checkpoint_root_dir", "continue_from_checkpoint", "algorithm"]
    order += ["model", "cluster", "buffer", "explorer", "synchronizer", "trainer", "monitor"]
    order += ["data_processor"]
    nested: Dict[str, Any] = {}
    for key in sorted(flat, key=lambda k: (order.index(k.split(".")[0]), k)):
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = flat[key]
    return nested


# ---- reading veRL input ------------------------------------------------------------------


def read_command(text: str) -> Dict[str, Any]:
    """The ``key=value`` overrides of a veRL launch script or command line.

    Shell variables the script assigns are expanded; any other ``$VAR`` becomes OmegaConf's
    ``${oc.env:VAR}``, so the YAML reads the environment when it runs, as the shell did.
    """
    text = text.replace("\\\n", " ")
    variables: Dict[str, str] = {}
    found: Dict[str, Any] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assignment = re.fullmatch(r"([A-Za-z_]\w*)=(.*)", line)
        if assignment and "." not in assignment.group(1):
            words = shlex.split(_expand(assignment.group(2), variables), comments=True)
            variables[assignment.group(1)] = words[0] if words else ""
            continue
        for word in shlex.split(_expand(line, variables), comments=True):
            key, sep, value = word.partition("=")
            if sep and re.fullmatch(r"[A-Za-z_][\w.]*", key) and "." in key:
                found[key] = parse_value(value)
    return found


def _expand(text: str, variables: Dict[str, str]) -> str:
    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name in variables:
            return variables[name]
        return "${oc.env:" + name + "}"

    text = text.replace("$@", "")
    return re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", sub, text)


def parse_value(text: str) -> Any:
    """A command-line value as Hydra reads it: numbers, booleans, lists, null, else a string."""
    for parse in (json.loads, _number, _yaml):
        try:
            return parse(text)
        except (ValueError, yaml.YAMLError):
            continue
    return text


def _number(text: str) -> float:
    value = float(text)  # also "1e-6", which YAML 1.1 reads as a string
    return int(value) if re.fullmatch(r"[+-]?\d+", text) else value


def _yaml(text: str) -> Any:
    value = yaml.safe_load(text)
    if isinstance(value, (dict, str)):  # a plain word stays the text as written
        raise ValueError("not a scalar or list")
    return value


def read_yaml(text: str) -> Dict[str, Any]:
    """The leaves of a veRL YAML config as dotted keys (lists are values)."""
    data = yaml.safe_load(text) or {}
    flat: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node

    walk(data, "")
    return flat


def to_yaml(config: Dict[str, Any], unmapped: List[str], source: Optional[str]) -> str:
    """The Trinity YAML, headed by where it came from and every key that was not mapped."""
    head = [f"# converted from veRL ({source or 'command line'}) by trinity convert-verl"]
    if unmapped:
        head.append("# veRL keys not mapped (set their Trinity equivalent by hand if needed):")
        head += [f"#   {line}" for line in unmapped]
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    return "\n".join(head) + "\n" + body


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value
