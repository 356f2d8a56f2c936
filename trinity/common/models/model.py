"""What workflows talk to: ``ModelWrapper`` in front of a rollout engine (``InferenceModel``).

``ModelWrapper.chat`` / ``generate`` return one ``Experience`` per sample with
``tokens``, ``prompt_length``, ``logprobs`` and ``response_text`` filled in, exactly the
fields the developer guide's workflows read, and ``model_version``, the weights that
sampled them. The engine behind it is either a Ray actor (in a real run) or a local object
(in unit tests).
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import fields
from typing import Any, Dict, Iterator, List, Optional

from trinity.common.experience import Experience
from trinity.common.models.hf_engine import SamplingParams

_PARAM_NAMES = {f.name for f in fields(SamplingParams)}


class InferenceModel(ABC):
    """A rollout engine: turns prompts into sampled responses and takes new weights."""

    @abstractmethod
    async def chat(
        self,
        messages: List[Dict[str, Any]],
        params: SamplingParams,
        tools: Optional[List[Dict[str, Any]]] = None,
    ) -> List[Experience]:
        """Sample ``params.n`` responses to a conversation (``tools``: OpenAI function
        schemas, rendered by the chat template), stamped with the model version."""

    @abstractmethod
    async def generate(self, prompt: str, params: SamplingParams) -> List[Experience]:
        """Sample ``params.n`` continuations of a raw text prompt."""

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

    def __init__(self, engine: Any, default_params: Optional[Dict[str, Any]] = None) -> None:
        self.engine = engine
        self.default_params = dict(default_params or {})
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

    def chat(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        **kwargs: Any,
    ) -> List[Experience]:
        """Sample responses to ``messages``; kwargs: n, temperature, top_p, top_k, max_tokens,
        stop, top_logprobs, seed; ``tools``: OpenAI function schemas for the chat template."""
        return self._call("chat", messages, self._params(kwargs), *([tools] if tools else []))

    def generate(self, prompts: List[str], **kwargs: Any) -> List[Experience]:
        """Sample continuations of each raw prompt; results are concatenated in prompt order."""
        params = self._params(kwargs)
        return [exp for prompt in prompts for exp in self._call("generate", prompt, params)]

    async def chat_async(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        **kwargs: Any,
    ) -> List[Experience]:
        extra = [tools] if tools else []
        return await self._acall("chat", messages, self._params(kwargs), *extra)

    async def generate_async(self, prompts: List[str], **kwargs: Any) -> List[Experience]:
        params = self._params(kwargs)
        results = await asyncio.gather(*(self._acall("generate", p, params) for p in prompts))
        return [exp for group in results for exp in group]

    @property
    def model_version(self) -> int:
        return self._call("model_version")

    async def model_version_async(self) -> int:
        """``model_version`` without blocking the event loop."""
        return await self._acall("model_version")

    def get_openai_client(self) -> Any:
        raise NotImplementedError(
            "explorer.rollout_model.enable_openai_api is not supported yet; use ModelWrapper.chat"
        )
