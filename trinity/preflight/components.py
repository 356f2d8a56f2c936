"""Pre-start checks of named components: workflows, reward functions, algorithm parts.

Each name must resolve in its registry, and each ``*_args`` mapping must bind to the named
parameters of the component's constructor. A constructor's ``**kwargs`` does not make an
unknown key acceptable: built-ins use it only to pass the trainer's shared values on, so a
typo there would otherwise be ignored. Built-in components are then constructed once, so
their own argument checks (ranges, choices) run before Ray starts too.
"""

from __future__ import annotations

import inspect
from typing import Any, Collection, Dict, Iterator, List, Tuple

from trinity.algorithm import ALGORITHM_TYPE, POLICY_LOSS_FN, advantage_fn_class, needs_reference
from trinity.algorithm.kl_fn.controller import build_kl_controller
from trinity.algorithm.rollout_correction import IS_WEIGHTS_KEY
from trinity.common.config.base import ConfigError, is_set, validate_model
from trinity.common.config.config import Config
from trinity.common.config.schema_buffer import StorageConfig
from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.common.workflows import WORKFLOWS
from trinity.common.workflows.workflow import missing_packages
from trinity.preflight.support import COMPONENT_REGISTRIES
from trinity.utils.suggest import did_you_mean

# What the trainer passes every sample strategy besides sample_strategy_args
# (trinity/trainer/trainer.py: Trainer.attach_reader).
STRATEGY_CONTEXT = ("reader", "auxiliary_readers", "group_size", "max_response_tokens")

# Keys of veRL's kl_ctrl, which the trainer pops from kl_penalty_fn_args
# (trinity/algorithm/kl_fn/controller.py: build_kl_controller).
KL_CTRL_KEYS = ("type", "kl_coef", "horizon", "target_kl")


# Built-in workflow -> the workflow_args keys it reads (trinity/common/workflows/); those
# declaring an ``args_model`` (math_boxed_workflow, the judges) are checked against it instead.
_SIMPLE_ARGS = ("greedy_baseline",)
WORKFLOW_ARGS = {
    **dict.fromkeys(("simple_workflow", "async_simple_workflow"), _SIMPLE_ARGS),
    **dict.fromkeys(("math_workflow", "async_math_workflow"), _SIMPLE_ARGS),
    **dict.fromkeys(("toolcall_workflow", "tool_call_workflow"), _SIMPLE_ARGS),
    **dict.fromkeys(("math_eval_workflow", "async_math_eval_workflow"), ()),
    **dict.fromkeys(("on_policy_distill_workflow", "on_policy_distill_math_workflow"), ()),
}

# Advantage fn -> the workflow_args flag that makes built-in workflows produce its input
# (remax subtracts the reward of a greedy answer, info["baseline_reward"]).
ADVANTAGE_WORKFLOW_FLAGS = {"remax": "greedy_baseline"}


def is_builtin(obj: Any) -> bool:
    """Whether ``obj`` is defined in the ``trinity`` package (not in a plugin)."""
    return getattr(obj, "__module__", "").split(".")[0] == "trinity"


def bind_problems(
    cls: Any, args: Dict[str, Any], path: str, owner: str, supplied: Collection[str] = ()
) -> List[str]:
    """One line per key of ``args`` that is not a named parameter of ``cls``'s constructor,
    and per required parameter that neither ``args`` nor the caller (``supplied``) gives."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no introspectable signature: nothing to hold it to
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = [name for name, p in parameters.items() if p.kind not in variadic]
    choices = [name for name in named if name not in supplied]
    problems = []
    for key in args:
        if key in named:
            continue
        hint = did_you_mean(key, choices)
        takes = ", ".join(choices) or "no arguments"
        problems.append(f"{path}.{key}: {owner} has no argument '{key}'{hint} (takes: {takes})")
    for name in named:
        if parameters[name].default is inspect.Parameter.empty:
            if name not in args and name not in supplied:
                problems.append(f"{path}: {owner} needs the argument '{name}'")
    return problems


def component_problems(config: Config, construct: bool) -> List[str]:
    """Names and arguments of the workflows, rewards and algorithm components a stage runs.

    ``construct``: also build the built-in algorithm components once (skipped when other
    checks already failed, since their own errors would repeat those problems).
    """
    problems = []
    if config.mode in ("both", "colocate", "explore", "bench"):
        problems += _taskset_problems(config)
    if config.mode in ("both", "colocate", "train", "serve"):
        problems += _algorithm_problems(config, construct)
    return list(dict.fromkeys(problems))  # a shared default is reported once


def _tasksets(config: Config) -> Iterator[Tuple[str, StorageConfig, bool]]:
    explorer_input = config.buffer.explorer_input
    for index, storage in enumerate(explorer_input.tasksets):
        yield f"buffer.explorer_input.tasksets[{index}]", storage, False
    for index, storage in enumerate(explorer_input.eval_tasksets):
        yield f"buffer.explorer_input.eval_tasksets[{index}]", storage, True


def origin_of(config: Config, path: str, storage: StorageConfig, key: str) -> str:
    """The YAML key a taskset's workflow or reward name came from (its own, or a default)."""
    if is_set(storage, key):
        return f"{path}.{key}"
    explorer_input = config.buffer.explorer_input
    if key == "default_workflow_type" and storage.is_eval:
        if explorer_input.default_eval_workflow_type is not None:
            return "buffer.explorer_input.default_eval_workflow_type"
    return f"buffer.explorer_input.{key}"


def resolve_workflow(config: Config, path: str, storage: StorageConfig) -> Tuple[Any, List[str]]:
    """(workflow class or None, problems) of a taskset."""
    key = origin_of(config, path, storage, "default_workflow_type")
    name = storage.default_workflow_type
    if not name:
        return None, [f"{key} is not set: name the workflow that runs this taskset's tasks"]
    try:
        return WORKFLOWS.get(name), []
    except KeyError as exc:
        return None, [f"{key} = {name}: {exc.args[0]}"]


def _taskset_problems(config: Config) -> List[str]:
    problems = []
    for path, storage, is_eval in _tasksets(config):
        workflow, found = resolve_workflow(config, path, storage)
        problems += found
        if workflow is not None and is_builtin(workflow):
            problems += _workflow_args_problems(config, path, storage, is_eval)
        if workflow is not None:
            problems += _package_problems(config, path, storage, workflow)
            problems += _api_problems(config, path, storage, workflow)
            problems += _declared_args_problems(path, storage, workflow)
            problems += _judge_problems(config, path, storage, workflow, is_eval)
        if workflow is not None and not is_eval:
            problems += _turn_state_problems(config, path, storage, workflow)
        key = origin_of(config, path, storage, "default_reward_fn_type")
        name = storage.default_reward_fn_type or getattr(workflow, "default_reward_fn", None)
        if name is None:
            if workflow is not None and hasattr(workflow, "default_reward_fn"):
                problems.append(
                    f"{key} is not set, and {storage.default_workflow_type} has no default "
                    "reward function: name one (e.g. math_reward)"
                )
            continue
        try:
            reward = REWARD_FUNCTIONS.get(name)
        except KeyError as exc:
            problems.append(f"{key} = {name}: {exc.args[0]}")
            continue
        args = dict(storage.reward_fn_args or {})
        bound = bind_problems(reward, args, f"{path}.reward_fn_args", f"reward '{name}'")
        problems += bound or _construct_reward(reward, args, path, name)
    return problems


def _construct_reward(reward: Any, args: Dict[str, Any], path: str, name: str) -> List[str]:
    """A built-in reward built once from its ``reward_fn_args``, so its own checks (DAPO's
    lengths) run before start; a plugin's constructor may do anything, so it is not run."""
    if not is_builtin(reward):
        return []
    try:
        reward(**args)
    except (TypeError, ValueError) as exc:
        return [f"{path}.reward_fn_args: reward '{name}': {exc}"]
    return []


def _workflow_args_problems(
    config: Config, path: str, storage: StorageConfig, is_eval: bool
) -> List[str]:
    """A built-in workflow's ``workflow_args``: known keys, and the flag the advantage needs."""
    name, args = storage.default_workflow_type or "", storage.workflow_args or {}
    known = WORKFLOW_ARGS.get(name)
    if known is None:
        return []
    problems = []
    for key in args:
        if key not in known:
            hint = did_you_mean(key, known)
            reads = ", ".join(known) or "none"
            problems.append(f"{path}.workflow_args.{key}: {name} reads no such key{hint} ({reads})")
    flag = ADVANTAGE_WORKFLOW_FLAGS.get(config.algorithm.advantage_fn or "")
    if flag and not is_eval and config.mode in ("both", "colocate") and not args.get(flag):
        problems.append(
            f"{path}.workflow_args.{flag} must be true: advantage_fn "
            f"{config.algorithm.advantage_fn} needs what {name} only adds then"
        )
    return problems


def _package_problems(
    config: Config, path: str, storage: StorageConfig, workflow: Any
) -> List[str]:
    """The optional packages a workflow imports (``needs_packages``) that are not installed."""
    key = origin_of(config, path, storage, "default_workflow_type")
    name = storage.default_workflow_type
    return [f"{key} = {name} {need}" for need in missing_packages(workflow)]


def _api_problems(config: Config, path: str, storage: StorageConfig, workflow: Any) -> List[str]:
    """A workflow whose model calls another program makes (``needs_openai_api``) needs the
    rollout model's OpenAI-compatible server, and tool calls parsed where those calls send
    tools (``sends_tools``)."""
    if not getattr(workflow, "needs_openai_api", False):
        return []
    rollout, name = config.explorer.rollout_model, storage.default_workflow_type
    if not rollout.enable_openai_api:
        key = origin_of(config, path, storage, "default_workflow_type")
        return [
            f"{key} = {name} calls the rollout model over its OpenAI-compatible API: set "
            "explorer.rollout_model.enable_openai_api: true"
        ]
    sends_tools = getattr(workflow, "sends_tools", None)
    if rollout.enable_auto_tool_choice or sends_tools is None:
        return []
    if sends_tools(storage.workflow_args or {}):
        return [
            f"{path}.workflow_args: {name} offers the model tools here: set "
            "explorer.rollout_model.enable_auto_tool_choice: true (its tool_call_parser "
            f"'{rollout.tool_call_parser}' reads the model's calls)"
        ]
    return []


def _declared_args_problems(path: str, storage: StorageConfig, workflow: Any) -> List[str]:
    """``workflow_args`` against the ``ConfigModel`` a workflow declares as ``args_model``."""
    args_model = getattr(workflow, "args_model", None)
    if args_model is None:
        return []
    try:
        validate_model(args_model, storage.workflow_args or {}, f"{path}.workflow_args")
    except ConfigError as exc:
        return exc.problems
    return []


def _judge_problems(
    config: Config, path: str, storage: StorageConfig, workflow: Any, is_eval: bool
) -> List[str]:
    """A judged workflow needs a judge model, one whose ``auxiliary_models_needed`` says its
    ``workflow_args`` use some needs that many, and one that scores a task's answers together
    needs them in one run (``explorer.max_repeat_times_per_runner`` splits training tasks)."""
    key = origin_of(config, path, storage, "default_workflow_type")
    name, problems = storage.default_workflow_type, []
    if getattr(workflow, "needs_judge", False) and not config.explorer.auxiliary_models:
        problems.append(
            f"{key} = {name} needs a judge: set explorer.auxiliary_models (the first one judges)"
        )
    needed = getattr(workflow, "auxiliary_models_needed", None)
    count = needed(storage.workflow_args or {}) if needed is not None else 0
    if count > len(config.explorer.auxiliary_models):
        problems.append(
            f"{path}.workflow_args asks {name} for {count} auxiliary model(s), and "
            f"explorer.auxiliary_models has {len(config.explorer.auxiliary_models)}: add them"
        )
    limit = config.explorer.max_repeat_times_per_runner
    repeats = storage.repeat_times or config.algorithm.repeat_times
    if getattr(workflow, "judges_whole_group", False) and not is_eval and limit:
        if limit < repeats:
            problems.append(
                f"explorer.max_repeat_times_per_runner = {limit} splits the {repeats} answers "
                f"of a task, and {name} (taskset '{storage.name}') judges them together in "
                f"one call; unset it or make it at least {repeats}"
            )
    return problems


def _turn_state_problems(
    config: Config, path: str, storage: StorageConfig, workflow: Any
) -> List[str]:
    """An advantage that compares turns by environment state (GiGPO) trains on a workflow
    that records each turn's state (``Workflow.records_turn_states``)."""
    advantage_fn = advantage_fn_class(config)
    if config.mode not in ("both", "colocate") or not getattr(
        advantage_fn, "needs_turn_states", False
    ):
        return []
    if getattr(workflow, "records_turn_states", False):
        return []
    return [
        f"{origin_of(config, path, storage, 'default_workflow_type')} = "
        f"{storage.default_workflow_type} (taskset '{storage.name}'): advantage_fn "
        f"{config.algorithm.advantage_fn} compares turns that answered the same environment "
        "state, and this workflow records no per-turn state; use one that does "
        "(guess_number_workflow), or a workflow with records_turn_states = True that passes "
        "states to merge_turns"
    ]


def _algorithm_problems(config: Config, construct: bool) -> List[str]:
    algorithm = config.algorithm
    if algorithm.algorithm_type not in ALGORITHM_TYPE:
        return []  # reported by the support check
    algorithm_cls = ALGORITHM_TYPE.get(algorithm.algorithm_type)
    problems = []
    for key, registry in COMPONENT_REGISTRIES.items():
        name = getattr(algorithm, key)
        if name is None or (
            key == "advantage_fn" and not getattr(algorithm_cls, "use_advantage", True)
        ):
            continue  # not built by the trainer
        try:
            cls = registry.get(name)
        except KeyError:
            continue  # reported by derive.py
        path, args = f"algorithm.{key}_args", dict(getattr(algorithm, f"{key}_args"))
        inert = getattr(cls, "inert_args", {})  # accepted unread: validate.warn_inert says so
        args = {k: v for k, v in args.items() if k not in inert}
        if key == "kl_penalty_fn":
            problems += _kl_ctrl_problems(args.pop("kl_ctrl", None), f"{path}.kl_ctrl")
        supplied = STRATEGY_CONTEXT if key == "sample_strategy" else ()
        found = bind_problems(cls, args, path, f"{key} '{name}'", supplied)
        if construct and not found and is_builtin(cls):
            found = _construct(config, key, cls, args, path)
        problems += found
    problems += _reference_problems(config, algorithm_cls)
    problems += _rollout_correction_problems(config, algorithm_cls)
    return problems


def _rollout_correction_problems(config: Config, algorithm_cls: Any) -> List[str]:
    """Rollout correction weighs and masks the policy loss of sampled tokens: it needs an
    algorithm that trains on rollouts, and (for the weights) a loss that takes them."""
    algorithm = config.algorithm
    correction = algorithm.rollout_correction
    if not correction.enabled:
        return []
    keys = ("rollout_is", "rollout_rs", "rollout_token_veto_threshold")
    key = next(k for k in keys if getattr(correction, k) is not None)
    path = f"algorithm.rollout_correction.{key} = {getattr(correction, key)}"
    if not algorithm_cls.use_advantage:
        return [
            f"{path}: algorithm_type {algorithm.algorithm_type} trains on data, not on rollouts "
            "with engine logprobs; rollout correction applies to RL algorithms"
        ]
    if correction.rollout_is is None:
        return []
    try:
        loss = POLICY_LOSS_FN.get(algorithm.policy_loss_fn)
    except KeyError:  # reported by derive.py
        return []
    if IS_WEIGHTS_KEY in loss.select_keys:
        return []
    return [
        f"algorithm.rollout_correction.rollout_is = {correction.rollout_is} is not supported "
        f"yet with policy_loss_fn {algorithm.policy_loss_fn}: its __call__ takes no "
        f"{IS_WEIGHTS_KEY} (docs/extending.md)"
    ]


def _kl_ctrl_problems(kl_ctrl: Any, path: str) -> List[str]:
    if kl_ctrl is None:
        return []
    if not isinstance(kl_ctrl, dict):
        return [f"{path} = {kl_ctrl}: expected a mapping like {{type: adaptive, target_kl: 6}}"]
    problems = []
    for key in kl_ctrl:
        if key not in KL_CTRL_KEYS:
            hint = did_you_mean(key, KL_CTRL_KEYS)
            problems.append(f"{path}.{key}: unknown key{hint} (keys: {', '.join(KL_CTRL_KEYS)})")
    if problems:
        return problems
    try:
        build_kl_controller(kl_ctrl, 0.001)
    except (TypeError, ValueError) as exc:
        return [f"{path}: {exc}"]
    return []


def _construct(config: Config, key: str, cls: Any, args: Dict[str, Any], path: str) -> List[str]:
    """Build a built-in component once with the run's arguments; its own checks may fail."""
    try:
        if key == "sample_strategy":
            buffers = config.buffer.trainer_input.auxiliary_buffers
            context = {
                "auxiliary_readers": {name: None for name in buffers},
                "group_size": config.algorithm.repeat_times,
                "max_response_tokens": config.model.max_response_tokens,
            }
            cls(None, **{**context, **args})
        else:
            cls(**args)
    except (TypeError, ValueError) as exc:
        return [f"{path}: {exc}"]
    return []


def _reference_problems(config: Config, algorithm_cls: Any) -> List[str]:
    """A KL fn or loss that reads reference logprobs needs an algorithm that loads one."""
    algorithm = config.algorithm
    try:
        needs_reference(
            algorithm_cls,
            algorithm.kl_loss_fn or "none",
            algorithm.kl_penalty_fn or "none",
            algorithm.policy_loss_fn,
        )
    except KeyError:  # an unknown component name, reported by derive.py
        return []
    except ValueError as exc:
        return [f"algorithm.algorithm_type = {algorithm.algorithm_type}: {exc.args[0]}"]
    return []
