"""An engine in this process: what an ``EngineActor`` is, without Ray (``trinity debug``, and
the stages ``runtime/local_stage.py`` runs).

The model runs on an event loop of its own thread (``LoopHost``), as it does on an engine
actor's loop, so calls from workflow threads batch together and the OpenAI-compatible server
(when asked for) serves from the same loop. A ``ModelWrapper`` takes a ``LocalEngine`` where it
takes an actor: the engine's methods (``chat``, ``generate``, ``model_version``...) block until
the loop has their answer, and ``api_address`` says where the server listens.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from trinity.engine.registry import ENGINES
from trinity.utils.loop_host import LoopHost


class LocalEngine(LoopHost):
    def __init__(
        self,
        engine_type: str,
        openai_api: Optional[Dict[str, Any]] = None,
        name: str = "local-engine",
        **engine_kwargs: Any,
    ) -> None:
        """Host the engine ``ENGINES`` registers as ``engine_type``, built with
        ``engine_kwargs``; ``openai_api``: where and how to serve it over the OpenAI API
        (``host``, ``port``, ``limits``, ``api_key``: ``runtime/explorer_role.openai_api``)
        (None: off), with ``"serve"``: the hooks of mode serve's routes; ``name``: the
        loop's thread."""
        engine_cls = ENGINES.get(engine_type)
        super().__init__(lambda: engine_cls(**engine_kwargs), name)
        self.api: Optional[Dict[str, Any]] = None
        if openai_api is not None:
            self.api = self.run(self._serve(openai_api, engine_kwargs["model_path"]))

    async def _serve(self, where: Dict[str, Any], model_path: str) -> Dict[str, Any]:
        from trinity.engine.server import serve_engine, served_at

        self.server = serve_engine(self.hosted, model_path, where)
        return served_at(model_path, self.server.url, where.get("api_key"))

    def api_address(self) -> Optional[Dict[str, Any]]:
        """``{"url", "model", "api_key"}`` of the OpenAI-compatible server (``server.served_at``),
        or None when it is off."""
        return self.api

    def close(self, wait: bool = True) -> None:
        """Stop the engine's own processes (vLLM's), then the loop (``LoopHost.close``)."""
        close = getattr(self.hosted, "close", None)
        if close is not None:
            close()
        super().close(wait)

    def close_server(self) -> None:
        """Stop the OpenAI-compatible server after answering the requests in flight."""
        if self.api is not None:
            self.run(self.server.close())
