"""``trinity debug``: a few tasks of a config's taskset through its workflow, in this process.

No Ray, no trainer, no buffer: the rollout engine (and any auxiliary model) runs in-process
(``engine.local.LocalEngine``, with its OpenAI-compatible server when the config asks for
one), a ``WorkflowRunner`` runs each task once, and every experience is printed: prompt and
response as the model's tokens, which response tokens the action mask trains on, logprobs,
reward and info. The fast path for writing a workflow: a raise shows its traceback here.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trinity.common.config.gpus import EXPLORING_MODES
from trinity.common.experience import Experience
from trinity.explorer.runner import TaskResult
from trinity.utils.suggest import did_you_mean


def choose_stage(labels: List[str], stages: List[Any], wanted: Optional[str]) -> int:
    """Index of the stage to debug: the one named ``wanted`` (``stages[i]`` is named
    ``labels[i]``; no labels: a config without ``stages``), else the first whose mode runs an
    explorer.

    The mode decides, not the tasksets: a train-only stage (e.g. ``sft``) inherits the
    global ``buffer.explorer_input`` yet never explores it.
    """
    explores = [s.mode in EXPLORING_MODES for s in stages]
    if wanted is None:
        if not any(explores):
            modes = ", ".join(EXPLORING_MODES)
            raise ValueError(f"no stage explores (none has mode {modes}): nothing to debug")
        return explores.index(True)
    if not labels:
        raise ValueError(f"--stage {wanted}: the config has no stages; leave --stage unset")
    if wanted not in labels:
        raise ValueError(
            f"--stage {wanted}: no such stage{did_you_mean(wanted, labels)} "
            f"(stages: {', '.join(labels)})"
        )
    index = labels.index(wanted)
    if not explores[index]:
        exploring = [label for label, e in zip(labels, explores, strict=True) if e]
        choose = f"choose one that does: {', '.join(exploring)}" if exploring else "none does"
        raise ValueError(
            f"--stage {wanted}: stage '{wanted}' has mode {stages[index].mode} and does not "
            f"explore, so there is nothing to debug; {choose}"
        )
    return index


def use_start_weights(stages: List[Any], index: int, staged: bool, model: Optional[str]) -> str:
    """Point stage ``index`` at the weights it would start from in a full run (``model``, when
    given, instead); the line saying which stage and which weights.

    A stage after one that trains starts from that stage's final weights: those of its
    folder when it has run all its steps, else (said) the stage's own ``model_path``.
    """
    from trinity.preflight.derive import planned_steps
    from trinity.runtime.stage_folder import progress

    stage = stages[index]
    what = f"stage {stage.name}" if staged else stage.name
    if model is not None:
        if not os.path.isdir(model):
            raise ValueError(f"--model {model}: no such folder (a Hugging Face model folder)")
        stage.model.model_path = model
        return f"debugging {what} with {model} (--model)"
    previous = stages[index - 1] if index > 0 else None
    if previous is None or previous.mode == "explore":  # the launcher's hand-over too
        return f"debugging {what} with {stage.model.model_path} (model.model_path)"
    steps = planned_steps(previous)
    done, final = progress(previous, steps)
    if final is not None:
        stage.model.model_path = final
        return f"debugging {what} with {previous.name}'s final weights (step {done}): {final}"
    if done is None:
        why = f"has not been run (no checkpoint in {previous.checkpoint_job_dir})"
    elif done == steps:
        why = f"has no HF export of its final step {done}"
    else:
        why = f"has not finished (its folder holds step {done} of the {steps} planned)"
    return (
        f"debugging {what} with the base model {stage.model.model_path}: stage {previous.name}, "
        f"whose final weights it starts from in a full run, {why}"
    )


def pick_tasks(config: Any, count: int, taskset: Optional[str]) -> List[Any]:
    """The first ``count`` tasks of the named taskset (train or eval; unset: the first
    training taskset), in its reading order, with debug task ids."""
    from trinity.buffer import TaskReader

    sets = [*config.buffer.explorer_input.tasksets, *config.buffer.explorer_input.eval_tasksets]
    if not sets:
        raise ValueError("the config has no taskset (buffer.explorer_input.tasksets) to debug")
    names = [s.name for s in sets]
    if taskset is not None and taskset not in names:
        raise ValueError(f"--taskset {taskset}: no such taskset; the config has {names}")
    storage = sets[names.index(taskset)] if taskset else sets[0]
    reader = TaskReader(storage)
    tasks = reader.read(min(count, len(reader)))
    for task in tasks:
        task.task_id = f"debug-{task.taskset_name}-{task.index}"
    return tasks


def start_engines(config: Any) -> tuple:
    """(rollout engine, [one engine per auxiliary model]) in this process."""
    from trinity.runtime.explorer_role import local_engine

    auxiliary = config.explorer.auxiliary_models
    return local_engine(config, "debug_engine"), [
        local_engine(config, f"debug_auxiliary_{i}_engine", aux) for i, aux in enumerate(auxiliary)
    ]


def debug(config: Any, count: int, taskset: Optional[str], console: Console) -> int:
    """Run ``count`` tasks and print what they produced; the number of tasks that failed."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from trinity.explorer.runner import WorkflowRunner

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per model is noise here
    tasks = pick_tasks(config, count, taskset)
    engine, auxiliary = start_engines(config)
    runner = WorkflowRunner(
        engine,
        default_params={
            "max_tokens": config.model.max_response_tokens,
            "min_tokens": config.model.min_response_tokens,
        },
        max_retry_times=0,  # show the first error as it is
        auxiliary_engines=auxiliary,
        enable_history=config.explorer.rollout_model.enable_history,
    )
    tokenizer = AutoTokenizer.from_pretrained(config.model.model_path)
    failed = 0
    try:
        for task in tasks:
            result = runner.run_task(task)
            failed += result.error is not None
            show_result(result, tokenizer, console)
    finally:
        for started in (engine, *auxiliary):
            if hasattr(started, "close"):
                started.close()
    return failed


def show_result(result: TaskResult, tokenizer: Any, console: Console) -> None:
    task = result.task
    head = f"task {task.task_id} ({task.workflow_cls.__name__}, {result.seconds:.2f}s)"
    console.rule(head)
    if result.error is not None:
        console.print(Text(result.error, style="red"), soft_wrap=True)  # paths unbroken
        return
    console.print(f"{len(result.experiences)} experience(s)")
    for i, exp in enumerate(result.experiences):
        show_experience(i, exp, tokenizer, console)


def show_experience(i: int, exp: Experience, tokenizer: Any, console: Console) -> None:
    """Experience ``i`` (its index in a task's result, or its row id in a buffer): prompt and
    response as tokens; response tokens the action mask trains on in green, the others (tool
    results, user turns) dimmed; then the numbers."""
    tokens = [int(t) for t in exp.tokens]
    response = tokens[exp.prompt_length :]
    mask = _as_list(exp.action_mask) or [1] * len(response)
    logprobs = _as_list(exp.logprobs)
    text = Text()
    text.append(tokenizer.decode(tokens[: exp.prompt_length]), style="cyan")
    for token, trained in zip(response, mask, strict=False):
        text.append(tokenizer.decode([token]), style="bold green" if trained else "dim")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("reward", str(exp.reward))
    table.add_row(
        "tokens",
        f"{len(tokens)} = {exp.prompt_length} prompt + {len(response)} response, "
        f"{int(sum(mask))} trained on",
    )
    if logprobs:
        trained = [lp for lp, m in zip(logprobs, mask, strict=False) if m]
        mean = sum(trained) / max(1, len(trained))
        table.add_row("logprobs", f"mean {mean:.3f} over trained tokens, min {min(logprobs):.3f}")
    if exp.info:
        table.add_row("info", str(exp.info))
    if exp.metrics:
        table.add_row("metrics", str(exp.metrics))
    console.print(f"[bold]experience {i}[/bold] (prompt in cyan, trained tokens in green)")
    console.print(text, soft_wrap=True)
    console.print(table)


def _as_list(values: Any) -> List[float]:
    if values is None:
        return []
    return values.tolist() if hasattr(values, "tolist") else list(values)
