"""``openenv_workflow``: episodes of an OpenEnv environment (openenv-core), one experience each.

The environment is a server: one that runs already (``workflow_args.url``, or the row's
``url`` column, which overrides both), or an app this
workflow serves itself (``app``, a dotted path of what openenv's ``create_app`` returned,
started once per process on a free port of 127.0.0.1 and stopped when the process exits).
Each episode is one WebSocket session of the environment's client (``client``; unset:
openenv's ``GenericEnvClient``): ``reset`` with ``reset_args`` and the row's ``seed`` and
``reset_args`` columns, then each turn the observation as the user message
(``observation_field``, or the first text field it has, or ``observation_to_text``), the
model's reply as the action (the reply text in the action's field ``action_field``, or
``reply_to_action``), ``step``, until the environment says done or ``max_turns`` replies.

Reward: the environment's, the sum of what its steps gave (``reward: last``: the last step's),
whether or not the episode ended; a step that gives none counts 0. Each turn's prompt
continues the previous turn's exact tokens, so the replies merge into one experience
(``merge_turns``): the replies are trained on, the observations are context. A server that
does not answer (after ``connect_tries`` tries) or an environment that raises fails the task
(``EnvError``, naming the URL), which the runner retries and counts (``rollout/tasks_failed``).
"""

from __future__ import annotations

import asyncio
import numbers
from typing import Any, Dict, List, Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from trinity.common.config.base import ConfigError, ConfigModel, validate_model
from trinity.common.experience import Experience
from trinity.common.workflows.multiturn import merge_turns, reply_room, turn_sampling
from trinity.common.workflows.openenv_env import (
    EnvError,
    connect,
    load_object,
    observation_text,
    openenv_core,
    served_url,
    text_action,
)
from trinity.common.workflows.workflow import WORKFLOWS, ResettableWorkflow, Task

Messages = List[Dict[str, Any]]


class OpenEnvArgs(ConfigModel):
    """``workflow_args`` of ``openenv_workflow``."""

    url: Optional[str] = Field(
        None,
        description="A running OpenEnv server (http://host:port); or set app. A row's url "
        "column overrides both.",
    )
    app_dir: Optional[str] = Field(
        None, description="A folder put first on the import path of app (an app not installed)."
    )
    app: Optional[str] = Field(
        None,
        description="An OpenEnv app to serve for the run (package.module:app, what openenv's "
        "create_app returned); once per process, on a free port of 127.0.0.1; or set url.",
    )
    client: Optional[str] = Field(
        None,
        description="The environment's EnvClient subclass (package.module:Name); unset: "
        "openenv's GenericEnvClient (dict observations and actions).",
    )
    action_type: Optional[str] = Field(
        None,
        description="The environment's Action class (package.module:Name), built from the "
        "reply; unset: a dict {action_field: reply}. Needed with client.",
    )
    action_field: str = Field("message", description="The action's field the reply text fills.")
    observation_field: Optional[str] = Field(
        None,
        description="The observation's field shown as the user message; unset: the first of "
        "text, message, prompt, content, observation it has.",
    )
    observation_to_text: Optional[str] = Field(
        None,
        description="A function (package.module:name) observation -> the user message "
        "(replaces observation_field).",
    )
    reply_to_action: Optional[str] = Field(
        None,
        description="A function (package.module:name) (reply text, observation) -> the action "
        "(replaces action_type/action_field).",
    )
    reset_args: Dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the environment's reset; a row's seed and reset_args "
        "columns are added over them.",
    )
    system_prompt: str = Field("", description="The episode's system turn (empty: none).")
    max_turns: int = Field(10, ge=1, description="Replies an episode may take.")
    max_reply_tokens: Optional[int] = Field(
        None,
        ge=1,
        description="Tokens one reply may take, within the episode's budget "
        "(rollout_args.max_tokens); unset: all that is left of it.",
    )
    reward: Literal["sum", "last"] = Field(
        "sum", description="The episode's reward: the sum of its steps' rewards, or the last."
    )
    connect_tries: int = Field(
        3, ge=1, description="Tries to connect to the server before the task fails."
    )
    connect_timeout: float = Field(10.0, gt=0, description="Seconds one connection try waits.")
    step_timeout: float = Field(
        60.0, gt=0, description="Seconds a reset or step may take before the episode fails."
    )
    startup_timeout: float = Field(
        120.0, gt=0, description="Seconds the server of app has to answer after it starts."
    )

    @field_validator("url")
    @classmethod
    def _a_url(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"'{value}' is not a server URL (http://host:port)")
        return value.rstrip("/") if value else value

    @field_validator("app")
    @classmethod
    def _an_app(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if value is not None and _installed():
            app = load_object(value, info.data.get("app_dir"))
            if not callable(app):
                raise ValueError(f"'{value}' is a {type(app).__name__}, not an ASGI app")
        return value

    @field_validator("client", "action_type", "observation_to_text", "reply_to_action")
    @classmethod
    def _imports(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and _installed():
            load_object(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> OpenEnvArgs:
        if (self.url is None) == (self.app is None):
            raise ValueError("url/app: set one of them (a running server, or an app to serve)")
        if self.app_dir is not None and self.app is None:
            raise ValueError("app_dir: only with app")
        if self.client and not (self.action_type or self.reply_to_action):
            raise ValueError(
                "action_type: a typed client sends the environment's Action class: name it "
                "(or set reply_to_action)"
            )
        if self.action_type and not self.reply_to_action and _installed():
            fields = getattr(load_object(self.action_type), "model_fields", {})
            if self.action_field not in fields:
                raise ValueError(
                    f"action_field: {self.action_type} has no field '{self.action_field}' "
                    f"(its fields: {', '.join(fields)})"
                )
        return self


def _installed() -> bool:
    """Whether openenv-core imports (the checks that need it are skipped where it does not:
    the missing package is reported on its own, ``needs_packages``)."""
    try:
        openenv_core()
    except ImportError:
        return False
    return True


@WORKFLOWS.register_module("openenv_workflow")
class OpenEnvWorkflow(ResettableWorkflow):
    """Plays ``rollout_args.n`` episodes of one task's OpenEnv environment, each one experience."""

    args_model = OpenEnvArgs
    needs_packages = {"openenv": "openenv"}

    def reset(self, task: Task) -> None:
        self.task = task
        where = f"taskset '{task.taskset_name}' row {task.index}"
        try:
            self.args: OpenEnvArgs = validate_model(
                OpenEnvArgs, task.workflow_args, "workflow_args"
            )
        except ConfigError as exc:
            raise ValueError(f"{where}: {'; '.join(exc.problems)}") from None
        row, self.reset_kwargs = task.raw_task, dict(self.args.reset_args)
        seed = row.get("seed")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
                raise ValueError(f"{where}: column 'seed' must be an integer >= 0, got {seed!r}")
            self.reset_kwargs["seed"] = int(seed)
        extra = row.get("reset_args") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"{where}: column 'reset_args' must be a mapping, got {extra!r}")
        self.reset_kwargs.update(extra)
        self.url = row.get("url") or self.args.url
        if not isinstance(self.url, (str, type(None))):
            raise ValueError(f"{where}: column 'url' must be a server URL, got {self.url!r}")
        args = self.args
        self.client_cls = load_object(args.client) if args.client else None
        self.action_cls = load_object(args.action_type) if args.action_type else None
        self.to_text = load_object(args.observation_to_text) if args.observation_to_text else None
        self.to_action = load_object(args.reply_to_action) if args.reply_to_action else None

    async def run_async(self) -> List[Experience]:
        """``rollout_args.n`` episodes, one after the other (``run`` runs this on its loop)."""
        url = self.url
        if url is None:  # started (or found) in a thread: starting waits for the server
            args = self.args
            url = await asyncio.to_thread(served_url, args.app, args.app_dir, args.startup_timeout)
        return [await self._episode(url) for _ in range(self.task.rollout_args.n)]

    async def _episode(self, url: str) -> Experience:
        """One episode from ``reset``, as one experience."""
        args = self.args
        client = await connect(
            self.client_cls, url, args.connect_tries, args.connect_timeout, args.step_timeout
        )
        try:
            result = await _call(url, "reset", client.reset(**self.reset_kwargs))
            messages = (
                [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
            )
            calls: List[Experience] = []
            rewards: List[float] = []
            end = "done"
            while not result.done:
                if len(calls) == args.max_turns:
                    end = "max_turns"
                    break
                messages = messages + [{"role": "user", "content": self._text(result.observation)}]
                reply = await self._reply(messages, calls)
                if reply is None:
                    end = "max_tokens"
                    break
                calls.append(reply)
                # The reply as returned: the engine continues its sampled tokens from it.
                messages = messages + [{"role": "assistant", "content": reply.response_text}]
                action = self._action(reply.response_text or "", result.observation)
                result = await _call(url, f"step {len(calls)}", client.step(action))
                rewards.append(float(result.reward or 0.0))
        finally:
            await client.close()
        if not calls:
            raise EnvError(f"the environment at {url} was done at reset, before a first reply")
        return self._experience(calls, rewards, bool(result.done), end)

    async def _reply(self, messages: Messages, calls: List[Experience]) -> Optional[Experience]:
        """The model's next reply, or None when the episode's token budget is spent."""
        room = await reply_room(self.model, messages, calls, self.task.rollout_args.max_tokens)
        if room is not None and room <= 0:
            return None
        cap = self.args.max_reply_tokens
        room = cap if room is None else min(room, cap or room)
        sampling = turn_sampling(self.task.rollout_args, max_tokens=room)
        return (await self.model.chat_async(messages, **sampling))[0]

    def _text(self, observation: Any) -> str:
        if self.to_text is None:
            return observation_text(observation, self.args.observation_field)
        text = self.to_text(observation)
        if not isinstance(text, str):
            raise EnvError(
                f"workflow_args.observation_to_text returned a {type(text).__name__}, not a str"
            )
        return text

    def _action(self, reply: str, observation: Any) -> Any:
        if self.to_action is not None:
            return self.to_action(reply, observation)
        return text_action(reply, self.args.action_field, self.action_cls)

    def _experience(
        self, calls: List[Experience], rewards: List[float], done: bool, end: str
    ) -> Experience:
        """The episode as one experience: the environment's reward and the metrics."""
        if self.args.reward == "sum":
            reward = float(sum(rewards))
        else:
            reward = rewards[-1] if rewards else 0.0
        metrics = {"turns": float(len(calls)), "env_done": float(done)}
        details = {"end": end, "step_rewards": list(rewards)}
        if "seed" in self.reset_kwargs:
            details["seed"] = self.reset_kwargs["seed"]
        exp = merge_turns(calls, reward=reward, info={**metrics, **details})
        exp.metrics.update(metrics)
        return exp


async def _call(url: str, what: str, call: Any) -> Any:
    """The environment's answer to ``call`` (a reset or step); ``EnvError`` naming the URL and
    the call when the server reports an error, times out or drops the connection."""
    try:
        return await call
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise EnvError(
            f"the OpenEnv environment at {url} failed at {what}: {type(exc).__name__}: {first}"
        ) from exc
