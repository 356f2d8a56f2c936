"""What the corpus harness changes in one of the original project's example configs before it
runs it, read from the YAML text alone (no run): the one-step size, the CPU cluster, and the
values a user would fill in (placeholders, data the user prepares), plus the hub ids the test
must serve from its Hugging Face cache.

Nothing else is changed: every key the config sets keeps its value. The plan is what the
harness passes as ``trinity run`` overrides and what the docs table lists as fills.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import yaml

# The run is cut to one train step of two tasks; groups (repeat_times > 1) keep two members.
STEPS, BATCH, GROUP = 1, 2, 2
RESPONSE_TOKENS = 32
# The tiny model's window (trinity/demo/tiny.py, preset micro32: 1024 positions, characters):
# a config's own max_model_len / max_prompt_tokens are brought inside it.
MODEL_LEN, PROMPT_TOKENS = 1024, 992

_ENV = re.compile(r"^\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,(.*))?\}$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[\w-]$")
# Values the original's examples write where the user puts their own: no run can use them.
_PLACEHOLDERS = ("/PATH/TO/", "{path to", "your/data/path", "/path/to/")
# Relative folders the original's README has the user build with a script before the run
# (countdown data, the ALFWorld/SciWorld/WebShop task lists, ...): filled like a placeholder.
_PREPARED_PREFIXES = ("examples/", "scripts/", "./", "countdown_dataset/", "../")
# Model keys: their hub ids are models, every other path a dataset.
MODEL_KEYS = ("model_path", "critic_model_path")
# Sections whose paths are not inputs the harness serves: veRL's own tree, the data
# processor's outputs and service URLs.
_SKIPPED = ("trainer_config", "service")


@dataclass
class Storage:
    """A dataset the config reads: its key, the value it names and what a row needs."""

    key: str  # dotted path of its `path` key
    value: str  # the value as resolved (env defaults applied)
    subset: Optional[str]
    split: Optional[str]
    section: Dict[str, Any]  # the storage's own mapping (format, prompt_type, ...)
    workflow: Optional[str] = None  # the workflow that reads its rows (tasksets)


@dataclass
class Plan:
    """The overrides of one run and what they are for."""

    overrides: List[str] = field(default_factory=list)
    fills: Dict[str, str] = field(default_factory=dict)  # key -> what a user would put there
    models: List[str] = field(default_factory=list)  # hub model ids served from the cache
    datasets: List[Storage] = field(default_factory=list)  # hub datasets served from the cache
    default_workflow: Optional[str] = None  # buffer.explorer_input.default_workflow_type


FillData = Callable[[Storage], str]  # the folder of synthetic rows a dataset placeholder gets


def read_raw(path: str) -> Dict[str, Any]:
    """The config's YAML as written (interpolations left as text)."""
    with open(path) as f:
        return yaml.safe_load(f) or {}


def env_value(value: Any) -> Tuple[Any, bool]:
    """(the value with ``${oc.env:VAR,default}`` replaced by its default, whether it is a
    placeholder: an env interpolation without a default). The test runs with no TRINITY_*
    variables set, as a user who set none."""
    if not isinstance(value, str):
        return value, False
    match = _ENV.match(value.strip())
    if not match:
        return value, False
    default = match.group(2)
    if default is None:
        return None, True
    return default.strip().strip("'\""), False


def is_placeholder(value: Any) -> bool:
    if value is None:
        return True
    text = str(value)
    return not text.strip() or any(p in text for p in _PLACEHOLDERS)


def is_prepared(value: str) -> bool:
    """A relative folder the user makes before the run (not a hub id, not a database)."""
    return value.startswith(_PREPARED_PREFIXES) and "://" not in value


def walk_all(
    node: Any, prefix: str = "", skip: Tuple[str, ...] = ()
) -> Iterator[Tuple[str, Any, Any]]:
    """(dotted key, value, parent mapping) of every leaf below ``node``, but those under a key
    in ``skip``."""
    items = node.items() if isinstance(node, dict) else enumerate(node or [])
    for key, value in items:
        path = f"{prefix}.{key}" if prefix else str(key)
        if str(key) in skip:
            continue
        if isinstance(value, (dict, list)):
            yield from walk_all(value, path, skip)
        else:
            yield path, value, node


def make_plan(raw: Dict[str, Any], fill_model: str, fill_data: FillData) -> Plan:
    """The plan for config ``raw``: ``fill_model`` is the folder a model placeholder gets,
    ``fill_data(storage)`` the folder a dataset placeholder gets."""
    plan = Plan(overrides=size_overrides(raw))
    explorer_input = (raw.get("buffer") or {}).get("explorer_input") or {}
    plan.default_workflow = explorer_input.get("default_workflow_type")
    for key, value, parent in walk_all(raw, skip=_SKIPPED):
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "checkpoint_root_dir" and is_placeholder(env_value(value)[0]):
            plan.fills[key] = "a temporary folder"
            plan.overrides.append(f"{key}=./checkpoints")
        elif leaf in MODEL_KEYS:
            _model(plan, key, value, fill_model)
        elif leaf == "path" and _is_input_storage(key, parent):
            _dataset(plan, key, value, parent, fill_data)
        elif leaf == "inputs" or re.search(r"\.inputs\.\d+$", key):
            fed = explorer_input.get("taskset") or (explorer_input.get("tasksets") or [{}])[0]
            _pipeline_input(plan, key, value, fed, fill_data)
    return plan


def _model(plan: Plan, key: str, value: Any, fill_model: str) -> None:
    resolved, unset = env_value(value)
    if unset or is_placeholder(resolved):
        plan.fills[key] = "the tiny model"
        plan.overrides.append(f"{key}={fill_model}")
    elif isinstance(resolved, str) and _HUB_ID.match(resolved) and resolved not in plan.models:
        plan.models.append(resolved)


def _is_input_storage(key: str, parent: Dict[str, Any]) -> bool:
    """A dataset the run reads: a taskset, SFT/DPO data, an auxiliary buffer. Queues and
    databases (``sqlite:///...``) are written by the run itself."""
    if "data_processor" in key.split("."):
        return False
    storage = str(parent.get("storage_type", "file"))
    return storage == "file" or "experience_buffer" not in key


def _dataset(plan: Plan, key: str, value: Any, parent: Dict[str, Any], fill_data: FillData) -> None:
    resolved, unset = env_value(value)
    if isinstance(resolved, str) and "://" in resolved:
        return  # a database the run writes
    storage = Storage(key, resolved, parent.get("subset_name"), parent.get("split"), parent)
    storage.workflow = parent.get("default_workflow_type") or plan.default_workflow
    if unset or is_placeholder(resolved) or is_prepared(str(resolved)):
        plan.fills[key] = "local synthetic data" + _columns_note(parent)
        plan.overrides.append(f"{key}={fill_data(storage)}")
    elif _HUB_ID.match(str(resolved)):
        plan.datasets.append(storage)


def _pipeline_input(
    plan: Plan, key: str, value: Any, fed: Dict[str, Any], fill_data: FillData
) -> None:
    """A data processor's input dataset (``task_pipeline.inputs``): filled when unset or a
    file of the original's examples folder (not in the corpus), with the columns of the
    training taskset ``fed`` it feeds."""
    resolved, unset = env_value(value)
    if unset or is_placeholder(resolved) or is_prepared(str(resolved)):
        storage = Storage(key, "", None, "train", fed)
        plan.fills[key] = "local synthetic data" + _columns_note(fed)
        plan.overrides.append(f"{key}={fill_data(storage)}")


def _columns_note(section: Dict[str, Any]) -> str:
    columns = sorted(set(row_columns(section)))
    return f" ({', '.join(columns)})" if columns else ""


def row_columns(section: Dict[str, Any]) -> Dict[str, str]:
    """{column: kind} a row of this storage holds, from its ``format`` keys."""
    fmt = section.get("format") or {}
    columns: Dict[str, str] = {}
    for key, value in fmt.items():
        if key.endswith("_key") and isinstance(value, str):
            columns[value] = key[: -len("_key")]
    selector = section.get("task_selector") or section.get("data_selector") or {}
    for name in selector.get("feature_keys") or []:
        columns[name] = "feature"
    return columns


def _stage_sections(raw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The config and each of its stages' mappings."""
    return [raw] + [s for s in raw.get("stages") or [] if isinstance(s, dict)]


def size_overrides(raw: Dict[str, Any]) -> List[str]:
    """One train step of ``BATCH`` tasks, groups of ``GROUP``, ``RESPONSE_TOKENS`` tokens, on
    CPU. A key the config (or a stage) sets is overridden there; ``buffer.batch_size`` and the
    step count always (their defaults are not small): ``buffer.total_steps``, or
    ``trainer.total_steps`` where the config counts steps there (the DPO examples)."""
    steps = "trainer" if _set_anywhere(raw, "trainer", "total_steps") else "buffer"
    out = ["cluster.gpu_per_node=0", f"{steps}.total_steps={STEPS}", f"buffer.batch_size={BATCH}"]
    out.append(f"model.max_response_tokens={RESPONSE_TOKENS}")
    repeat = _set_anywhere(raw, "algorithm", "repeat_times")
    group = GROUP if repeat and max(repeat) > 1 else 1
    if group > 1:
        out.append(f"algorithm.repeat_times={GROUP}")
    length, prompt = (
        _set_anywhere(raw, "model", k) for k in ("max_model_len", "max_prompt_tokens")
    )
    if length or not prompt:  # with neither set, the window is the model's
        out.append(f"model.max_model_len={MODEL_LEN}")
    if prompt:
        out.append(f"model.max_prompt_tokens={PROMPT_TOKENS}")
    # 0.1.1 set the lengths under explorer.rollout_model, which has them too (unset: model's),
    # and an auxiliary model (a judge) has its own: all within the tiny model's window
    explorer = raw.get("explorer") or {}
    served = {"explorer.rollout_model": explorer.get("rollout_model") or {}}
    for index, aux in enumerate(explorer.get("auxiliary_models") or []):
        served[f"explorer.auxiliary_models.{index}"] = aux if isinstance(aux, dict) else {}
    sizes = {"max_model_len": MODEL_LEN, "max_prompt_tokens": PROMPT_TOKENS}
    sizes["max_response_tokens"] = RESPONSE_TOKENS
    for key, section in served.items():
        out += [f"{key}.{k}={v}" for k, v in sizes.items() if k in section]
    return out + _train_batch(raw, group) + _group_sizes(raw, group)


def _train_batch(raw: Dict[str, Any], group: int) -> List[str]:
    """``buffer.train_batch_size`` where the config sets it (or a mix config's ratio needs it):
    one explore step's experiences (a batch of SFT/DPO rows), and for the mix algorithms the
    expert rows their ``expert_data_ratio`` adds, with the loss arguments that repeat those
    sizes."""
    algorithm = raw.get("algorithm") or {}
    ratio = (algorithm.get("sample_strategy_args") or {}).get("expert_data_ratio")
    # a mix config that leaves it unset takes its expert rows out of batch_size x repeat_times
    # (3 RL rows of 4 here: not whole groups), so the step's sizes are given
    if not _set_anywhere(raw, "buffer", "train_batch_size") and not ratio:
        return []
    if str(algorithm.get("algorithm_type", "")) in ("sft", "dpo"):
        return [f"buffer.train_batch_size={BATCH}"]
    usual = BATCH * group
    expert = max(1, round(usual * ratio / (1 - ratio))) if ratio else 0
    out = [f"buffer.train_batch_size={usual + expert}"]
    loss_args = algorithm.get("policy_loss_fn_args") or {}
    sizes = {
        "train_batch_size_usual": usual,
        "train_batch_size_expert": expert,
        "ppo_mini_batch_size": usual + expert,
    }
    out += [f"algorithm.policy_loss_fn_args.{k}={v}" for k, v in sizes.items() if k in loss_args]
    return out


def _group_sizes(raw: Dict[str, Any], group: int) -> List[str]:
    """The early releases also give the group size as a taskset's ``rollout_args.n``: it
    follows ``repeat_times``."""
    out = []
    for key, value, _ in walk_all(raw.get("buffer") or {}, "buffer"):
        if key.endswith(".rollout_args.n") and isinstance(value, int) and value > 1:
            out.append(f"{key}={group}")
    return out


def _set_anywhere(raw: Dict[str, Any], section: str, key: str) -> List[Any]:
    """The values ``section.key`` has in the config and its stages (empty when unset)."""
    found = []
    for part in _stage_sections(raw):
        value = (part.get(section) or {}).get(key)
        if value is not None:
            found.append(value)
    return found
