"""What workflows talk to: ``ModelWrapper`` in front of a rollout engine (``InferenceModel``).

``ModelWrapper.chat`` / ``generate`` return one ``Experience`` per sample with
``tokens``, ``prompt_length``, ``logprobs`` and ``response_text`` filled in, exactly the
fields the developer guide's workflows read, and ``model_version``, the weights that
sampled them. The engine behind it is either a Ray actor or a local object (a ``LocalEngine``
in a stage that runs in one process, a plain engine in unit tests).

With ``explorer.rollout_model.enable_openai_api`` the engine also serves an OpenAI-compatible
API; ``get_openai_client()`` / ``get_openai_async_client()`` return ``openai`` clients for it.
With ``enable_history`` the wrapper records every call made through it or its clients, as
the exact ``Experience``s the engine returned, until ``extract_experience_from_history()``
takes them. The record belongs to one wrapper: the runner gives each workflow instance its
own (``fork``) and clears it before the instance runs its next task, so a record holds at
most the calls of one task.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from abc import ABC, abstractmethod
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import fields
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple

from trinity.common.experience import Experience
from trinity.common.models.reply_tokens import RECORD_HEADER, SESSION_HEADER
from trinity.common.models.sampling import SamplingParams

_PARAM_NAMES = {f.name for f in fields(SamplingParams)}


class InferenceModel(ABC):
    """A rollout engine: turns prompts into sampled responses and takes new weights.

    Engines are registered by ``engine_type`` in ``trinity.engine.ENGINES``.
    """

    # True: the engine runs a model in this process, so the explorer gives each engine a
    # host of its own (a Ray ``EngineActor``, or a ``LocalEngine`` in a one-process stage) that
    # builds it as ``cls(**kwargs)`` from the served model's keys. False: it is a client of a
    # model served elsewhere (``external``), built where the explorer is and handed to the
    # runners as it is.
    hosted: ClassVar[bool] = True
    # Fields of the served model's config section (``explorer.rollout_model`` or an auxiliary
    # model's) that the host passes to this engine as keyword arguments of the same name,
    # besides the ones every hosted engine takes (``runtime/explorer_role.py: engine_kwargs``).
    config_keys: ClassVar[Tuple[str, ...]] = ()
    # Values elsewhere in the run's config the host passes too: keyword -> dotted path
    # (the tinker engine's base model, ``model.tinker.base_model``).
    config_paths: ClassVar[Dict[str, str]] = {}

    @abstractmethod
    async def chat(
        self,
        messages: List[Dict[str, Any]],
        params: SamplingParams,
        tools: Optional[List[Dict[str, Any]]] = None,
        session: Optional[str] = None,
    ) -> List[Experience]:
        """Sample ``params.n`` responses to a conversation (``tools``: OpenAI function
        schemas, rendered by the chat template), stamped with the model version.

        ``session`` names the workflow run the call belongs to (``ModelWrapper`` passes one
        per run, and the engine hosts always pass it on): an engine may continue a recent
        turn of it from its exact tokens (the ``transformers`` engine does); one that keeps
        no conversations ignores it."""

    @abstractmethod
    async def generate(self, prompt: str, params: SamplingParams) -> List[Experience]:
        """Sample ``params.n`` continuations of a raw text prompt."""

    async def prompt_length(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        session: Optional[str] = None,
    ) -> int:
        """Tokens of the prompt ``chat`` would sample from for this conversation now (with a
        ``session``, continued from its recent turns as ``chat`` continues them); nothing is
        sampled or recorded. Not abstract: an engine that cannot count says so."""
        raise NotImplementedError(f"{type(self).__name__} does not count prompt tokens")

    @abstractmethod
    async def generate_ids(self, prompt_ids: List[int], params: SamplingParams) -> List[Experience]:
        """Sample ``params.n`` continuations of a prompt given as token ids (token-in: no
        re-tokenization, so a multi-turn episode stays exactly the tokens sampled)."""

    @abstractmethod
    async def load_weights(self, weights: Any, version: int) -> None:
        """Replace the weights (a state dict, or a path to one) and record their version."""

    @abstractmethod
    async def model_version(self) -> int:
        """The trainer step of the weights currently loaded."""


class ModelWrapper:
    """The model a workflow uses: an OpenAI-like ``chat`` over the rollout engine."""

    def __init__(
        self,
        engine: Any,
        default_params: Optional[Dict[str, Any]] = None,
        enable_history: bool = False,
    ) -> None:
        self.engine = engine
        self.default_params = dict(default_params or {})
        self.enable_history = enable_history
        # Names this wrapper's conversations in the engine (each fork has its own).
        self.session = uuid.uuid4().hex
        self._history: List[Experience] = []
        self._history_lock = threading.Lock()  # clients record from the threads calling them
        self._api: Optional[Dict[str, Any]] = None  # the engine's server: url, model, api_key
        self._clients: Dict[str, Any] = {}
        # The versions seen by the running task, see track_versions. A context variable, not a
        # thread-local: in ``concurrent_mode: asynchronous`` many tasks share one thread, and
        # each asyncio task (and each thread) has its own context.
        self._versions: ContextVar[Optional[List[int]]] = ContextVar("versions", default=None)

    def _params(self, kwargs: Dict[str, Any]) -> SamplingParams:
        merged = {**self.default_params, **{k: v for k, v in kwargs.items() if v is not None}}
        unknown = set(merged) - _PARAM_NAMES
        if unknown:
            raise TypeError(
                f"unknown sampling argument(s) {sorted(unknown)}; valid: {sorted(_PARAM_NAMES)}"
            )
        return SamplingParams(**merged)

    def _call(self, method: str, *args: Any) -> Any:
        target = getattr(self.engine, method)
        if hasattr(target, "remote"):  # a Ray actor handle
            import ray

            return self._seen(ray.get(target.remote(*args)))
        result = target(*args)
        return self._seen(asyncio.run(result) if inspect.iscoroutine(result) else result)

    async def _acall(self, method: str, *args: Any) -> Any:
        target = getattr(self.engine, method)
        if hasattr(target, "remote"):
            return self._seen(await target.remote(*args))
        if hasattr(self.engine, "submit"):  # a LoopHost: await its loop, do not block ours
            return self._seen(await asyncio.wrap_future(self.engine.submit(method, *args)))
        result = target(*args)
        return self._seen(await result if inspect.iscoroutine(result) else result)

    def _seen(self, result: Any) -> Any:
        versions = self._versions.get()
        if versions is not None and isinstance(result, list):
            versions.extend(e.model_version for e in result if isinstance(e, Experience))
        return result

    @contextmanager
    def track_versions(self) -> Iterator[List[int]]:
        """Collect the model versions of the samples the current task receives while inside.

        "Task" is the current thread, or the current asyncio task when many share one thread;
        coroutines the task starts (``asyncio.gather``) and threads it starts with
        ``asyncio.to_thread`` inherit the list, so their samples count too.
        """
        seen: List[int] = []
        token = self._versions.set(seen)
        try:
            yield seen
        finally:
            self._versions.reset(token)

    def fork(self) -> ModelWrapper:
        """A wrapper over the same engine and defaults with its own history and clients.

        Version tracking is shared: inside ``track_versions`` of this wrapper, the fork's
        samples count too.
        """
        other = ModelWrapper(self.engine, self.default_params, self.enable_history)
        other._versions = self._versions
        return other

    def _record(self, experiences: List[Experience]) -> List[Experience]:
        if self.enable_history:
            with self._history_lock:
                self._history.extend(experiences)
        return experiences

    def chat(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        **kwargs: Any,
    ) -> List[Experience]:
        """Sample responses to ``messages``; kwargs: n, temperature, top_p, top_k, max_tokens,
        stop, top_logprobs, seed; ``tools``: OpenAI function schemas for the chat template.

        A conversation that extends an earlier call's (its messages, one of its replies as
        returned, then new messages) is continued from that call's exact tokens
        (``trinity.engine.conversation``): what the model sees is what it sampled.
        """
        return self._record(self._call("chat", *self._chat_args(messages, tools, kwargs)))

    def generate(self, prompts: List[str], **kwargs: Any) -> List[Experience]:
        """Sample continuations of each raw prompt; results are concatenated in prompt order."""
        params = self._params(kwargs)
        return [
            exp
            for prompt in prompts
            for exp in self._record(self._call("generate", prompt, params))
        ]

    async def chat_async(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        **kwargs: Any,
    ) -> List[Experience]:
        return self._record(await self._acall("chat", *self._chat_args(messages, tools, kwargs)))

    def _chat_args(self, messages: Any, tools: Any, kwargs: Dict[str, Any]) -> tuple:
        """``chat``'s arguments; the session only for engines that keep conversations (a
        test's stand-in engine may take just messages and params)."""
        args: tuple = (messages, self._params(kwargs))
        if self._takes_session("chat"):
            return (*args, tools, self.session)
        return (*args, tools) if tools else args

    def _takes_session(self, method: str) -> bool:
        target = getattr(self.engine, method)
        return hasattr(target, "remote") or "session" in inspect.signature(target).parameters

    def prompt_length(
        self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None
    ) -> int:
        """Tokens of the prompt ``chat(messages, tools)`` would sample from now, a
        conversation that continues an earlier call counted from that call's tokens, as
        ``chat`` continues it; nothing is sampled or recorded (the original Trinity-RFT's
        ``get_message_token_len``)."""
        return self._call("prompt_length", *self._length_args(messages, tools))

    async def prompt_length_async(
        self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None
    ) -> int:
        """``prompt_length`` without blocking the event loop."""
        return await self._acall("prompt_length", *self._length_args(messages, tools))

    def _length_args(self, messages: Any, tools: Any) -> tuple:
        session = (self.session,) if self._takes_session("prompt_length") else ()
        return (messages, tools, *session)

    async def generate_async(self, prompts: List[str], **kwargs: Any) -> List[Experience]:
        params = self._params(kwargs)
        results = await asyncio.gather(*(self._acall("generate", p, params) for p in prompts))
        return self._record([exp for group in results for exp in group])

    @property
    def model_version(self) -> int:
        return self._call("model_version")

    async def model_version_async(self) -> int:
        """``model_version`` without blocking the event loop."""
        return await self._acall("model_version")

    def _api_address(self) -> Dict[str, Any]:
        """The engine's server (asked once per wrapper: an engine that restarted serves on a
        new port, and the runner gives the next workflow instance a new wrapper)."""
        if self._api is None:
            found = self._call("api_address") if hasattr(self.engine, "api_address") else None
            if not found:
                raise ValueError(
                    "the OpenAI-compatible API is off: set "
                    "explorer.rollout_model.enable_openai_api: true to use get_openai_client()"
                )
            self._api = found
        return self._api

    def _client(self, kind: str) -> Any:
        if kind not in self._clients:
            from trinity.common.models import client

            if hasattr(self.engine, "openai_client"):  # an API's client engine: its URL, key
                self._clients[kind] = self.engine.openai_client(is_async=kind == "async")
                return self._clients[kind]
            api = self._api_address()
            make = client.openai_client if kind == "sync" else client.openai_async_client
            record = self._record_reply if self.enable_history else None
            key = api.get("api_key")  # a Secret when explorer.api_server requires a key
            self._clients[kind] = make(
                api["url"], api["model"], record, self.session, key.reveal() if key else None
            )
        return self._clients[kind]

    def _record_reply(self, experiences: List[Experience]) -> None:
        # A recorded reply also says which weights sampled it (see track_versions).
        self._seen(self._record(experiences))

    def get_openai_client(self) -> Any:
        """An ``openai.OpenAI`` for the engine's server, or for the API of an external model
        (``client.model_path``: the model name to send). With ``enable_history`` its calls
        are recorded like ``chat``'s."""
        return self._client("sync")

    def get_openai_async_client(self) -> Any:
        """``get_openai_client`` for asyncio code: an ``openai.AsyncOpenAI``."""
        return self._client("async")

    def endpoint(self, record_key: Optional[str] = None) -> Dict[str, Any]:
        """The engine's OpenAI-compatible server for a program the workflow starts (an agent
        harness, a subprocess with its own HTTP client): ``base_url`` (ending in ``/v1``),
        ``model``, ``api_key`` (None where none is checked) and the ``headers`` its requests
        carry: this wrapper's session (a conversation continues from its exact tokens) and,
        with ``record_key``, the key the server keeps each reply under for ``take_recorded``."""
        api = self._api_address()
        key = api.get("api_key")
        headers = {SESSION_HEADER: self.session}
        if record_key is not None:
            headers[RECORD_HEADER] = record_key
        return {
            "base_url": f"{api['url']}/v1",
            "model": api["model"],
            "api_key": key.reveal() if key else None,
            "headers": headers,
        }

    async def take_recorded(self, record_key: str) -> List[Experience]:
        """The replies the server kept under ``record_key`` (see ``endpoint``), oldest first,
        as the engine returned them; with ``enable_history`` they join the history too."""
        from trinity.common.models.client import take_recorded

        api = self._api_address()
        key = api.get("api_key")
        found = await take_recorded(api["url"], record_key, key.reveal() if key else None)
        return self._seen(self._record(found))

    def extract_experience_from_history(self, clear_history: bool = True) -> List[Experience]:
        """Every recorded call's experiences, in the order the replies arrived, exactly as the
        engine returned them (token ids, logprobs, texts); ``clear_history`` empties the record.
        """
        if not self.enable_history:
            raise ValueError(
                "model calls are not recorded: set explorer.rollout_model.enable_history: true "
                "to use extract_experience_from_history()"
            )
        with self._history_lock:
            experiences = list(self._history)
            if clear_history:
                self._history.clear()
        return experiences

    def clear_history(self) -> None:
        """Forget the recorded calls (the runner does this between tasks)."""
        with self._history_lock:
            self._history.clear()
