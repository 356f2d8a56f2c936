"""An engine in this process: what an ``EngineActor`` is, without Ray (``trinity debug``).

The model runs on an event loop of its own thread, as it does on an engine actor's loop, so
calls from workflow threads batch together and the OpenAI-compatible server (when asked for)
serves from the same loop. A ``ModelWrapper`` takes a ``LocalEngine`` where it takes an actor:
the engine's methods (``chat``, ``generate``, ``model_version``...) block until the loop has
their answer, and ``api_address`` says where the server listens.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from typing import Any, Callable, Dict, Optional


class LocalEngine:
    def __init__(self, openai_api: Optional[Dict[str, Any]] = None, **engine_kwargs: Any) -> None:
        """``engine_kwargs``: ``TransformersInferenceModel``'s; ``openai_api``: ``{"host",
        "port"}`` to serve it over the OpenAI API (None: off)."""
        from trinity.common.models.transformers_model import TransformersInferenceModel

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="local-engine", daemon=True).start()
        self.model = TransformersInferenceModel(**engine_kwargs)
        self.api: Optional[Dict[str, str]] = None
        if openai_api is not None:
            self.api = self._run(self._serve(openai_api, engine_kwargs["model_path"]))

    async def _serve(self, where: Dict[str, Any], model_path: str) -> Dict[str, str]:
        from trinity.engine.server import RunningServer, ServedModel, build_app

        app = build_app(ServedModel.from_transformers(self.model, model_path))
        self.server = RunningServer(app, where["host"], where["port"])
        return {"url": self.server.url, "model": model_path}

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def api_address(self) -> Optional[Dict[str, str]]:
        """``{"url", "model"}`` of the OpenAI-compatible server, or None when it is off."""
        return self.api

    def __getattr__(self, name: str) -> Callable:
        """The model's own method ``name``, run on the engine's loop (same signature, so a
        wrapper sees the parameters it looks for)."""
        if name.startswith("_") or name == "model":  # not set yet: no model to ask
            raise AttributeError(name)
        method = getattr(self.model, name)

        @functools.wraps(method)
        def call(*args: Any) -> Any:
            result = method(*args)
            return self._run(result) if inspect.iscoroutine(result) else result

        return call

    def close(self) -> None:
        """Stop the server and the model's batching, then the loop."""
        self._run(self._cancel_others())
        self.loop.call_soon_threadsafe(self.loop.stop)

    @staticmethod
    async def _cancel_others() -> None:
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
