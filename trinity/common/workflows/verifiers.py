"""``verifiers_workflow``: episodes of a verifiers environment (verifiers 0.4, ``verifiers.v1``).

The environment is what ``vf-eval <env_id>`` runs: ``env_id`` names its taskset (an installed
package, or a module of the folder ``env_dir`` that exports a ``Taskset`` subclass in
``__all__``; verifiers' loader takes top-level names, not dotted paths),
``env_args`` that taskset's config (verifiers' ``--env.taskset.*``), ``env_config`` the rest of
verifiers' environment config (``--env.*``: ``agent.harness``, ``agent.max_turns``, timeouts,
another ``Env`` class by ``id``). Built by verifiers' own loader (``load_environment``) once per
process. An agent seat with no ``runtime`` runs its harness program on this host
(``subprocess``; verifiers' default is Prime's hosted sandboxes).

Each task is one of the environment's tasks: the row's ``task_index`` picks one of the
taskset's own, in its order; a row without it is the task's data itself (its ``TaskData``
fields: ``prompt``, ``answer``...). The workflow plays ``rollout_args.n`` episodes of it at
once through verifiers (``Env.run_episode``): the harness program talks to the rollout model's
OpenAI-compatible server through verifiers' interception proxy, with the tools the task
declares, and the task's ``@reward`` functions and judges score the trace. Sampling:
``rollout_args`` temperature, top_p, top_k, stop and max_tokens (per model call).

Each call's reply is kept on the server under the episode's key and taken after the episode
(``ModelWrapper.endpoint`` / ``take_recorded``), so experiences are the exact tokens the engine
sampled. A call continuing an earlier one's tokens (the next turn of the conversation, tool
results between) joins it: each conversation is one experience (``merge_turns``), the replies
trained on, tool results, user turns and template tokens masked out. The reward is the
trace's (verifiers' weighted sum of its rewards; with several agents, the mean of the trainable
ones), the same for each of the episode's experiences; each reward function's score and each
``@metric`` go to the experience's metrics by name. An episode that verifiers records as
failed (the harness, a tool server, a hook or scoring raised, a timeout) fails the task
(``EnvError`` with verifiers' first error), which the runner retries and counts
(``rollout/tasks_failed``).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any, Dict, List, Optional

from pydantic import Field, model_validator

from trinity.common.config.base import ConfigModel
from trinity.common.experience import Experience
from trinity.common.workflows.multiturn import conversations, merge_turns
from trinity.common.workflows.verifiers_env import (
    EnvError,
    declares_tools,
    env_key,
    episode_failure,
    load_env,
    prepared_once,
    row_task,
    serving,
    use_env_dir,
    uv_on_path,
    vf,
    why_it_does_not_load,
)
from trinity.common.workflows.workflow import (
    WORKFLOWS,
    ResettableWorkflow,
    Task,
    read_workflow_args,
)

# The variable verifiers reads the rollout server's API key from, where one is required.
API_KEY_VARIABLE = "TRINITY_ROLLOUT_API_KEY"


class VerifiersArgs(ConfigModel):
    """``workflow_args`` of ``verifiers_workflow``."""

    env_id: str = Field(
        ...,
        min_length=1,
        description="The verifiers environment: its taskset's id, an installed package as "
        "vf-eval takes it, or a module of env_dir (exporting a Taskset in __all__).",
    )
    env_dir: Optional[str] = Field(
        None,
        description="A folder of environment modules, put first on the import path here and "
        "in the programs verifiers starts (tool servers); unset: installed packages only.",
    )
    env_args: Dict[str, Any] = Field(
        default_factory=dict,
        description="The taskset's config (verifiers' --env.taskset.* keys, e.g. num_tasks).",
    )
    env_config: Dict[str, Any] = Field(
        default_factory=dict,
        description="The rest of verifiers' env config (--env.*: agent.harness.id, "
        "agent.max_turns, timeout...); a seat without runtime runs on this host (subprocess).",
    )

    @model_validator(mode="after")
    def _loads(self) -> VerifiersArgs:
        if _installed():
            use_env_dir(self.env_dir)
            problem = why_it_does_not_load(self.env_id, self.env_args, self.env_config)
            if problem:
                raise ValueError(problem)
        return self


def _installed() -> bool:
    """Whether verifiers is installed (the missing package is reported on its own)."""
    import importlib.util

    return importlib.util.find_spec("verifiers") is not None


@WORKFLOWS.register_module("verifiers_workflow")
class VerifiersWorkflow(ResettableWorkflow):
    """Plays ``rollout_args.n`` episodes of one task of a verifiers environment."""

    args_model = VerifiersArgs
    needs_packages = {"verifiers": "verifiers"}
    needs_openai_api = True  # verifiers' harness programs call the model over HTTP

    @classmethod
    def sends_tools(cls, workflow_args: Dict[str, Any]) -> bool:
        """Whether the environment declares tool servers (its harness's own are not known)."""
        if not _installed():
            return False
        try:
            args = VerifiersArgs.model_validate(workflow_args)
        except ValueError:  # the args check reports it, naming the key
            return False
        use_env_dir(args.env_dir)
        return declares_tools(load_env(args.env_id, args.env_args, args.env_config))

    def reset(self, task: Task) -> None:
        self.task = task
        self.args: VerifiersArgs = read_workflow_args(VerifiersArgs, task)
        args = self.args
        use_env_dir(args.env_dir)
        self.env_key = env_key(args.env_id, args.env_args, args.env_config)
        self.env = load_env(args.env_id, args.env_args, args.env_config)
        where = f"taskset '{task.taskset_name}' row {task.index}"
        self.vf_task = row_task(self.env, task.raw_task, where)

    async def run_async(self) -> List[Experience]:
        """The episodes of this task, at once, inside the environment's serving resources."""
        uv_on_path()
        async with prepared_once(self.env_key), serving(self.env):
            episodes = await asyncio.gather(
                *(self._episode() for _ in range(self.task.rollout_args.n))
            )
        return [exp for episode in episodes for exp in episode]

    async def _episode(self) -> List[Experience]:
        """One episode: its conversations as experiences, each with the episode's reward."""
        key = uuid.uuid4().hex
        try:
            episode = await self.env.run_episode(self.vf_task, self._context(key))
        finally:  # taken even when the episode raised: the server forgets them
            calls = await self.model.take_recorded(key)
        why = episode_failure(episode, bool(calls))
        if why:
            raise EnvError(f"verifiers environment '{self.args.env_id}': episode failed: {why}")
        traces = [t for t in episode.traces if t.agent.trainable] or list(episode.traces)
        reward = sum(t.reward for t in traces) / len(traces)
        metrics = _trace_metrics(traces)
        info = {"env_id": self.args.env_id, "stop": traces[0].stop_condition, **metrics}
        experiences = []
        for turns in conversations(calls):
            exp = merge_turns(turns, reward=float(reward), info=info)
            exp.metrics.update(metrics)
            experiences.append(exp)
        return experiences

    def _context(self, key: str) -> Any:
        """verifiers' ``ModelContext``: the rollout server, this episode's record key, the
        taskset's sampling."""
        where = self.model.endpoint(record_key=key)
        client: Dict[str, Any] = {"base_url": where["base_url"], "headers": where["headers"]}
        if where["api_key"]:
            os.environ[API_KEY_VARIABLE] = where["api_key"]
            client["api_key_var"] = API_KEY_VARIABLE
        args = self.task.rollout_args
        sampling = {"temperature": args.temperature, "top_p": args.top_p}
        if args.max_tokens is not None:
            sampling["max_tokens"] = args.max_tokens
        if args.top_k > 0:
            sampling["top_k"] = args.top_k  # vLLM's extra field, which the server reads
        if args.stop:
            sampling["stop"] = list(args.stop)
        return vf().ModelContext(
            model=where["model"],
            client=vf().EvalClientConfig(**client),
            sampling=vf().SamplingConfig(**sampling),
        )


def _trace_metrics(traces: List[Any]) -> Dict[str, float]:
    """Each reward function's score and each metric of the traces (means over agents), and
    the model turns."""
    values: Dict[str, List[float]] = {}
    for trace in traces:
        scores = {name: r.score for name, r in trace.rewards.items() if r is not None}
        found = {**scores, **{k: v for k, v in trace.metrics.items() if v is not None}}
        found["turns"] = trace.num_turns
        for name, value in found.items():
            values.setdefault(name, []).append(float(value))
    return {name: sum(v) / len(v) for name, v in values.items()}
