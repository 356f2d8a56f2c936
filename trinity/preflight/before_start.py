"""Everything ``trinity run`` can check before Ray starts, in one pass over every stage.

``check_before_start(root)`` first overrides what this machine's hardware lacks
(``hardware.py``: each such problem is said, with the overrides, and the rest is checked as
the config runs here), resolves each stage's hub ids to local folders
(``hub_ids.py``), finalizes it (``derive.py``: support, derived values, ranges), then checks
what needs the filesystem or the registries: model folders (``model_folders.py``),
datasets (paths, splits, columns, enough rows for a step), workflow, reward and algorithm
component names and arguments, chat templates, the folders a run writes to, and the monitor
(package, arguments, server). It raises one
``ConfigError`` listing every problem of every stage (each prefixed with its stage when
there are several), or returns the finalized stages.
"""

from __future__ import annotations

import os
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from trinity.algorithm.algorithm import PairExperienceModel
from trinity.buffer.file_reader import load_rows
from trinity.buffer.row_checks import row_schema
from trinity.buffer.selector import feature_schema
from trinity.buffer.storages import path_missing, read_as_rows, storage_kind
from trinity.common.config.base import ConfigError, is_set
from trinity.common.config.config import Config, external_models
from trinity.common.config.gpus import gpu_shares
from trinity.common.config.lora_checks import lora_folder_problems, lora_handover_problems
from trinity.common.config.schema_buffer import StorageConfig
from trinity.preflight.api_checks import api_key_problems
from trinity.preflight.bench_checks import bench_problems
from trinity.preflight.components import (
    component_problems,
    is_builtin,
    resolve_workflow,
)
from trinity.preflight.decoupled import reads_explorer_store
from trinity.preflight.derive import derive
from trinity.preflight.env_folders import fold_missing_folders
from trinity.preflight.hardware import fix_stages, stage_overrides
from trinity.preflight.hosting import ray_reasons
from trinity.preflight.hub_ids import HubIds, hub_keys
from trinity.preflight.model_folders import (
    chat_template_of,
    model_folder_problems,
    template_render_problem,
    tokenizer_folder_problems,
)
from trinity.preflight.monitor_checks import monitor_problems
from trinity.preflight.operators import operator_problems
from trinity.preflight.precision import warn_half_precision
from trinity.preflight.ranks import warn_ranks
from trinity.preflight.serve_checks import port_problems
from trinity.preflight.served_engines import served_engine_problems
from trinity.preflight.support import algorithm_class
from trinity.preflight.tinker_checks import handover_problems, service_problems
from trinity.preflight.unsupported import not_naming, set_aside_keys
from trinity.preflight.validate import read_storages, warn_inert
from trinity.preflight.vllm_checks import vllm_problems
from trinity.utils.database import connection_problem, database_url, sqlite_file

CONNECT_CHECK_S = 5.0  # how long the check waits for a database server to answer

# Built-in workflow -> the row parts it reads ("prompt": prompt_key, or messages_key for
# messages data, plus system_prompt_key when set; "response": response_key, the answer
# its reward compares with). trinity/common/workflows/simple.py.
WORKFLOW_COLUMNS = {"simple_workflow": ("prompt",), "math_workflow": ("prompt", "response")}


def check_before_start(
    root: Config,
    download: bool = True,
    problems: Sequence[str] = (),
    unread: Sequence[str] = (),
    env_folders: Optional[Dict[str, str]] = None,
) -> List[Config]:
    """Finalize every stage of ``root`` and check everything checkable without Ray.

    ``problems``: what reading the config found (``read_config``), listed first; ``unread``:
    the keys whose values did not parse there, which the checks read at their defaults, so
    their lines naming those keys are dropped. What this machine lacks is fixed first
    (``hardware.py``: its problems listed, the rest checked as the config would run here).
    Hub ids are resolved next, to the local folders everything after reads (``hub_ids.py``;
    ``download``: fetch what the cache lacks), unless a stage has problems already.
    ``env_folders``: the config's ``${oc.env:VAR,default}/...`` folders
    (``loader.env_folder_defaults``), each missing one said once instead of once per path in
    it (``env_folders.py``). Returns the finalized stages; raises one ``ConfigError`` naming
    every problem found (``incomplete`` when a check could not run).
    """
    try:
        fixed = fix_stages(root.stage_configs())
    except ConfigError as exc:  # a stage whose sections do not merge: none to check
        raise ConfigError([*problems, *exc.problems], incomplete=True) from None
    raw = [config for config, _ in fixed]
    labels = [stage.stage_name for stage in root.stages] or ["main"]
    found: List[Tuple[str, str]] = [(problem, "") for problem in problems]
    found += [
        (fix.problem, label)
        for (_, fixes), label in zip(fixed, labels, strict=True)
        for fix in fixes
    ]
    incomplete = bool(unread)
    stages: List[Config] = []
    hub = HubIds(download)
    for index, (config, label) in enumerate(zip(raw, labels, strict=True)):
        chained = index > 0 and raw[index - 1].mode != "explore"
        last = index == len(raw) - 1
        keys = _stage_keys(unread, index)
        stage, stage_found, skipped = _check_stage(
            config, hub, chained=chained, last=last, unread=keys, earlier=problems
        )
        found += [(problem, label) for problem in stage_found]
        incomplete = incomplete or skipped
        stages.append(stage)
    found = fold_missing_folders(found, env_folders or {})
    if found:
        overrides = stage_overrides([fixes for _, fixes in fixed], staged=bool(root.stages))
        merged = _merge_stage_labels(found, several=len(raw) > 1)
        raise ConfigError(merged, overrides=overrides, incomplete=incomplete)
    for stage in stages:
        warn_inert(stage)
        warn_ranks(stage)
        warn_half_precision(stage)
    return stages


def _check_stage(
    config: Config,
    hub: HubIds,
    *,
    chained: bool,
    last: bool,
    unread: List[str],
    earlier: Sequence[str],
) -> Tuple[Config, List[str], bool]:
    """One stage: (the stage finalized, its problems, whether some check could not run).

    ``chained``: it trains the previous stage's final weights; ``earlier``: the problems
    reading the config found; ``unread``: see ``check_before_start``."""
    set_aside = set_aside_keys(config)  # values derive replaces, and says so
    refused = bool(earlier or set_aside)
    if refused:  # nothing is downloaded for a config that cannot run as it is
        hub_problems, unresolved = [], hub_keys(config, model_from_previous=chained)
    else:
        hub_problems, unresolved = hub.resolve_stage(config, model_from_previous=chained)
    stage, problems = derive(config)
    later = stage_problems(stage, model_from_previous=chained, construct=not problems)
    if not last and stage.mode != "explore":
        later += _handover_problems(stage)
    problems = _not_about(problems + not_naming(later, set_aside), unresolved)
    problems = hub_problems + not_naming(problems, unread)
    return stage, problems, bool(set_aside or (refused and unresolved))


def _stage_keys(keys: Sequence[str], index: int) -> List[str]:
    """``keys`` of the root config as stage ``index`` names them (``stages[i].x`` is ``x``)."""
    own = f"stages[{index}]."
    return [
        key.removeprefix(own)
        for key in keys
        if key.startswith(own) or not key.startswith("stages[")
    ]


def _not_about(problems: List[str], keys: List[str]) -> List[str]:
    """``problems`` less the lines about ``keys``, whose hub id did not resolve: a missing
    folder or unreadable data there only repeats the hub's line."""
    heads = tuple(head for key in keys for head in (f"{key} ", f"{key}:"))
    return [p for p in problems if not heads or not p.startswith(heads)]


def _merge_stage_labels(found: List[Tuple[str, str]], several: bool) -> List[str]:
    """Each distinct problem once, prefixed with the stages that have it (if several); the
    problems of the whole config (no stage label) come first, as they are."""
    stages_of: Dict[str, List[str]] = {}
    for problem, label in found:
        stages_of.setdefault(problem, []).append(label)
    if not several:
        return list(stages_of)
    lines = []
    for problem, labels in stages_of.items():
        names = ", ".join(f"'{label}'" for label in labels if label)
        if not names:
            lines.append(problem)
            continue
        lines.append(f"stage{'s' if len(labels) > 1 else ''} {names}: {problem}")
    return lines


def _handover_problems(stage: Config) -> List[str]:
    problems = lora_handover_problems(stage) + handover_problems(stage)
    # a Tinker stage's line above says why; the HF export is not its problem
    if stage.model.tinker.enable or stage.trainer.save_hf_checkpoint != "never":
        return problems
    return problems + [
        "trainer.save_hf_checkpoint = never, but the next stage starts from this stage's "
        "final HF checkpoint; use last"
    ]


def stage_problems(config: Config, model_from_previous: bool, construct: bool) -> List[str]:
    """Every problem of one derived stage that needs the filesystem or the registries.

    ``model_from_previous``: the stage trains the previous stage's final weights, so its
    ``model.model_path`` is not read now. ``construct``: see ``component_problems``.
    """
    problems = component_problems(config, construct)
    problems += operator_problems(config, construct)
    problems += _model_problems(config, model_from_previous)
    problems += lora_folder_problems(config, model_from_previous)
    problems += _data_problems(config)
    problems += _output_problems(config)
    problems += bench_problems(config)
    problems += monitor_problems(config)
    problems += _process_problems(config)
    problems += port_problems(config)
    problems += api_key_problems(config)
    problems += vllm_problems(config)
    problems += served_engine_problems(config)
    problems += service_problems(config)
    return problems


def _process_problems(config: Config) -> List[str]:
    """A colocated stage, or one whose roles share one GPU, runs in this process; what would
    send it to Ray instead (``gpus.py`` says what runs where)."""
    reasons = ray_reasons(config)
    if not reasons:
        return []
    why = "; ".join(reasons)
    if config.mode == "colocate":
        return [
            f"mode colocate runs trainer and engines in one process, but this stage needs "
            f"Ray ({why})"
        ]
    shares = gpu_shares(config)
    if shares.total != 1 or not shares.problems():  # CPUs, or a GPU (or more) per role
        return []
    return [
        f"cluster.gpu_per_node = 1: the trainer and the engines share the one GPU in one "
        f"process, but this stage needs Ray ({why}); remove what needs Ray, or give each "
        f"role a GPU of its own (cluster.gpu_per_node: {shares.engine_gpus + shares.trains})"
    ]


# ---- models ------------------------------------------------------------------------------
def _model_problems(config: Config, model_from_previous: bool) -> List[str]:
    model, explorer = config.model, config.explorer
    paths: List[Tuple[str, str]] = []
    rollout = explorer.rollout_model
    # An external rollout model (explore mode only) needs just a tokenizer to make
    # experiences with; its own model_path, if set, is a name sent to the API. A Tinker run
    # reads just the tokenizer too: the service holds the model (model.tinker.base_model).
    external = rollout.engine_type == "external"
    tokenizer_only = external or model.tinker.enable
    if not model_from_previous and not tokenizer_only:
        paths.append(("model.model_path", model.model_path))
    explores = config.mode in ("both", "colocate", "explore", "bench")
    if explores and is_set(rollout, "model_path") and not external:
        paths.append(("explorer.rollout_model.model_path", rollout.model_path))
    algorithm_cls = algorithm_class(config)
    uses_critic = getattr(algorithm_cls, "use_critic", False) and config.mode != "explore"
    if uses_critic and (not model_from_previous or is_set(model, "critic_model_path")):
        paths.append(("model.critic_model_path", model.critic_model_path))
    for index, aux in enumerate(explorer.auxiliary_models):
        if aux.engine_type != "external":  # an external model's model_path is its API name
            paths.append((f"explorer.auxiliary_models[{index}].model_path", aux.model_path))
    problems, seen = _external_problems(config), set()
    if tokenizer_only and not model_from_previous and model.model_path:
        problems += tokenizer_folder_problems("model.model_path", model.model_path)
    for key, path in paths:
        if path and path not in seen:
            seen.add(path)
            problems += model_folder_problems(key, path)
    if not problems and not model_from_previous and model.model_path:
        problems += _chat_template_problems(config)
    return problems


def _external_problems(config: Config) -> List[str]:
    """Each external model's base URL variable is set here, before anything starts (the
    launcher passes the values on to the explorer)."""
    problems = []
    for path, _, served, external in external_models(config):
        name = external.base_url_env
        if served.engine_type == "external" and not os.environ.get(name):
            problems.append(
                f"{path}.base_url_env = {name}: the environment variable {name} is not set; "
                "export it to the API's base URL (e.g. http://host:8000/v1)"
            )
    return problems


def _chat_template_problems(config: Config) -> List[str]:
    """Built-in workflows chat with the model; SFT/DPO data is rendered with a template."""
    model = config.model
    template = model.custom_chat_template or chat_template_of(model.model_path)
    if template is not None:
        problem = template_render_problem(template)
        where = (
            "model.custom_chat_template"
            if model.custom_chat_template
            else (f"model.model_path = {model.model_path}: its chat template")
        )
        return [] if problem is None else [f"{where} fails to render a conversation: {problem}"]
    users = ["mode serve (chat completions)"] if config.mode == "serve" else []
    if config.mode in ("both", "colocate", "explore", "bench"):
        for path, storage in read_storages(config, ("tasksets", "eval_tasksets")):
            workflow, _ = resolve_workflow(config, path, storage)
            if workflow is not None and is_builtin(workflow):
                users.append(f"{path} ({storage.default_workflow_type})")
    for path, storage in read_storages(config, ("experience_buffer", "auxiliary_buffers")):
        sft_data = read_as_rows(storage, _is_experience_buffer(path))
        if sft_data and storage.format.chat_template is None:
            users.append(f"{path} (SFT/DPO data)")
    if not users:
        return []
    return [
        f"model.model_path = {model.model_path}: the tokenizer has no chat template, which "
        f"{users[0]} needs; set model.chat_template_path or model.custom_chat_template"
    ]


# ---- data --------------------------------------------------------------------------------
def _data_problems(config: Config) -> List[str]:
    """Each dataset the stage reads (of a kind that reads rows) loads with the row checks of
    its reader, has the columns its workflow reads, and can fill a step."""
    problems, rows = [], {}
    kinds = ("tasksets", "eval_tasksets", "experience_buffer", "auxiliary_buffers")
    for path, storage in read_storages(config, kinds):
        if not read_as_rows(storage, _is_experience_buffer(path)):
            continue  # a store holds no data yet
        if _is_experience_buffer(path) and algorithm_class(config) is None:
            continue  # read as the algorithm reads it, which is unknown (reported)
        if path_missing(storage):
            continue  # reported already
        # The reader's own row checks, so skip_bad_rows skips here what it skips in the run.
        schema = {
            **row_schema(storage.format, _reader_of(config, path)),
            **feature_schema(storage.task_selector),
        }
        try:
            data = load_rows(storage, columns=schema, path_label=path)
        except Exception as exc:  # whatever `datasets` raises: name the storage, not a trace
            text = _first_lines(exc)
            problems.append(text if text.startswith(path) else f"{path}: {text}")
            continue
        rows[path] = len(data)
        problems += _workflow_column_problems(config, path, storage, data.column_names)
    return problems + _row_count_problems(config, rows)


def _is_experience_buffer(path: str) -> bool:
    return path == "buffer.trainer_input.experience_buffer"


def _first_lines(exc: BaseException, limit: int = 8) -> str:
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return "\n    ".join(lines[:limit])


def _reader_of(config: Config, path: str) -> str:
    """Which reader consumes a storage (``row_checks.row_schema``'s names)."""
    if path.startswith("buffer.explorer_input"):
        return "taskset"
    return "dpo" if _paired(config) and path.endswith("experience_buffer") else "sft"


def _workflow_column_problems(
    config: Config, path: str, storage: StorageConfig, present: List[str]
) -> List[str]:
    """Columns a built-in workflow reads though ``format`` leaves them at their defaults."""
    workflow, _ = resolve_workflow(config, path, storage)
    name = storage.default_workflow_type or ""
    parts = WORKFLOW_COLUMNS.get(name, ())
    if workflow is None or not is_builtin(workflow) or not parts:
        return []
    fmt, keys = storage.format, []
    if "prompt" in parts:
        keys += ["messages_key"] if fmt.prompt_type == "messages" else ["prompt_key"]
    keys += ["response_key"] if "response" in parts else []
    missing = [k for k in keys if getattr(fmt, k) not in present]
    if not missing:
        return []
    named = ", ".join(f"format.{k} = {getattr(fmt, k)}" for k in missing)
    return [
        f"{path}: {name} reads column(s) {named}, missing from {storage.path} (split "
        f"'{storage.split}', columns: {', '.join(present)}); set {path}.format.{missing[0]} "
        "to the data's column"
    ]


def _row_count_problems(config: Config, rows: Dict[str, int]) -> List[str]:
    """A step needs ``batch_size`` tasks (``train_batch_size`` rows when training on files)."""
    buffer, problems = config.buffer, []
    taskset_rows = {p: n for p, n in rows.items() if p.startswith("buffer.explorer_input.tasksets")}
    total = sum(taskset_rows.values())
    if taskset_rows and len(taskset_rows) == len(buffer.explorer_input.tasksets):
        if buffer.batch_size > total:
            where = next(iter(taskset_rows)) if len(taskset_rows) == 1 else "the training tasksets"
            problems.append(
                f"buffer.batch_size = {buffer.batch_size} exceeds the {total} rows of {where}: "
                f"no explore step could be filled; use at most {total}"
            )
    data_rows = rows.get("buffer.trainer_input.experience_buffer")
    if data_rows is not None and buffer.train_batch_size:
        paired = _paired(config)
        needed = buffer.train_batch_size // 2 if paired else buffer.train_batch_size
        unit = "pairs (rows)" if paired else "rows"
        if needed > data_rows:
            problems.append(
                f"buffer.train_batch_size = {buffer.train_batch_size} needs {needed} {unit} per "
                f"step, more than the {data_rows} of buffer.trainer_input.experience_buffer: no "
                "train step could be filled"
            )
    return problems


def _paired(config: Config) -> bool:
    algorithm_cls = algorithm_class(config)
    return getattr(algorithm_cls, "schema", None) is PairExperienceModel


# ---- outputs -----------------------------------------------------------------------------
def _output_problems(config: Config) -> List[str]:
    """The job folder must be writable, and so must each SQLite file a role writes; a
    database server must answer (one connection, a few seconds at most)."""
    root = config.checkpoint_root_dir
    problems = writable_problems("checkpoint_root_dir", root, config.checkpoint_job_dir, True)
    for key, path, written in database_paths(config):
        problems += _database_problems(key, path, written)
    return problems


def database_paths(config: Config) -> List[Tuple[str, str, bool]]:
    """(YAML key, path, whether a role writes it) of each database the stage opens that
    reading rows before start (``_data_problems``) does not reach: the experience buffer,
    which the explorer writes and the trainer reads (a ``train`` run reads what a separate
    explore run wrote), and the `sql` tasksets a ``train`` run counts its steps from
    (``launcher.planned_steps``)."""
    found: List[Tuple[str, str, bool]] = []
    storage = config.buffer.trainer_input.experience_buffer
    opened = config.mode != "bench"  # bench reads none
    if opened and storage is not None and storage.path and storage_kind(storage).holds_experiences:
        found.append(("buffer.trainer_input.experience_buffer.path", storage.path, True))
    if reads_explorer_store(config) and config.buffer.total_steps is None:
        for index, taskset in enumerate(config.buffer.explorer_input.tasksets):
            if storage_kind(taskset).database_path and taskset.path:
                key = f"buffer.explorer_input.tasksets[{index}].path"
                found.append((key, taskset.path, False))
    return found


def _database_problems(key: str, path: str, written: bool) -> List[str]:
    try:
        url = database_url(path)
    except ValueError:
        return []  # reported by the config checks
    file = sqlite_file(url)
    if file is None:  # a database server
        problem = connection_problem(url, timeout=CONNECT_CHECK_S)
        return [f"{key}: {problem}"] if problem else []
    if os.path.isdir(file):  # e.g. a stage's SFT data, storage_type inherited
        return [
            f"{key} = {path}: {os.path.abspath(file)} is a folder, but this storage keeps its "
            "rows in a SQLite file; a folder of data files is storage_type: file (a stage "
            "inherits the global buffer's storage_type unless it sets its own)"
        ]
    if not written:
        return [] if os.path.isfile(file) else [f"{key} = {path}: no such SQLite file"]
    return writable_problems(key, path, file, False)


def writable_problems(key: str, value: str, target: str, is_folder: bool) -> List[str]:
    """Whether ``target`` (a folder or a file that ``key = value`` leads to) can be made or
    written: what exists of it must have the right kind, and be writable."""
    target = os.path.abspath(target)
    if os.path.exists(target) and os.path.isdir(target) != is_folder:
        wanted, found = ("a folder", "a file") if is_folder else ("a file", "a folder")
        return [f"{key} = {value}: {target} is {found}; expected {wanted}"]
    if os.path.isfile(
        target
    ):  # an existing file (a resumed or shared database) is written in place
        if not os.access(target, os.R_OK | os.W_OK):
            return [f"{key} = {value}: cannot write {target} (permission denied)"]
        probe = os.path.dirname(target)  # SQLite writes its journal beside the file
    else:
        probe = target
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            return [f"{key} = {value}: {probe} is a file, so the folders below it cannot be made"]
    if not os.access(probe, os.W_OK | os.X_OK):
        return [f"{key} = {value}: cannot write in {probe} (permission denied)"]
    try:  # root passes os.access everywhere; /proc or a read-only mount still refuse
        os.rmdir(tempfile.mkdtemp(prefix=".trinity-write-check-", dir=probe))
    except OSError as exc:
        return [f"{key} = {value}: cannot create folders in {probe} ({exc.strerror})"]
    return []
