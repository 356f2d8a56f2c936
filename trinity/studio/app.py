"""The studio's web app: one page (static/) and a JSON API over ``form`` and ``checks``.

Checks run in a worker thread (they read model folders and datasets); the page sends the
whole raw value tree each time, so the server keeps no state between requests. The page's
first paint needs one request: the form comes with the opening config's values and check.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Dict, Optional

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel

from trinity.common.config.base import ConfigError
from trinity.studio import checks
from trinity.studio.form import form_definitions

STATIC = os.path.join(os.path.dirname(__file__), "static")


class Values(BaseModel):
    values: Dict[str, Any] = {}


class FileRequest(BaseModel):
    path: str
    values: Dict[str, Any] = {}


@lru_cache(maxsize=1)
def _form() -> Dict[str, Any]:
    return form_definitions()


def create_app(initial_path: Optional[str] = None) -> FastAPI:
    """The studio app; ``initial_path`` is the YAML file the page opens with (if any).

    The opening config is checked once here, before the server listens: the first check of
    a model folder and dataset imports torch and transformers (seconds), which the first
    page would otherwise wait for, showing "checking...".
    """
    app = FastAPI(title="Trinity-RFT studio", docs_url=None, redoc_url=None, openapi_url=None)
    checks.opening(initial_path)

    @app.get("/")
    def page() -> FileResponse:
        return FileResponse(os.path.join(STATIC, "index.html"))

    @app.get("/studio.js")
    def script() -> FileResponse:
        return FileResponse(os.path.join(STATIC, "studio.js"), media_type="text/javascript")

    @app.get("/api/form")
    def form() -> Dict[str, Any]:
        # checked again on each page load: the file may have changed since the start
        return {**_form(), "path": initial_path or "", "opening": checks.opening(initial_path)}

    @app.post("/api/check")
    async def check(body: Values) -> Dict[str, Any]:
        return await run_in_threadpool(checks.check, body.values)

    @app.post("/api/load")
    def load(body: FileRequest) -> Dict[str, Any]:
        try:
            return {"values": checks.load(body.path), "problems": []}
        except ConfigError as exc:
            return {"values": None, "problems": exc.problems}

    @app.post("/api/save")
    def save(body: FileRequest) -> Dict[str, Any]:
        try:
            return {"saved": checks.save(body.values, body.path), "problems": []}
        except (ConfigError, OSError) as exc:
            problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            return {"saved": None, "problems": problems}

    return app
