"""What ``mode: serve`` adds to the OpenAI-compatible app (``server.build_app``).

Upstream Trinity-RFT's names and bodies: ``POST /feedback`` ``{"reward": number, "msg_ids":
[reply id, ...], "task_id": str (optional), "run_id": int (optional)}`` sets a reward on the
replies named (every choice of each); ``POST /commit`` (optional body ``{"task_id": str}``)
makes the rewarded, uncommitted replies (of that task, or all) the next step of the
experience buffer the trainer reads; ``GET /metrics`` and ``GET /health``.

The app calls a ``ServeHooks``-like object (``runtime/serve_role.py``) that owns the
bookkeeping; it raises ``APIError`` for what it refuses (404 unknown reply id, 409 already
committed or nothing to commit, 503 training stopped). Here: the body checks (400 not JSON,
422 a reward that is not a number or ids that are not strings) and the rule that keeps
recorded logprobs trainable: a request samples at the trainer's temperature.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Protocol, Tuple

from fastapi import FastAPI, Request

from trinity.common.experience import Experience
from trinity.engine.openai_protocol import APIError


class ServeHooks(Protocol):
    """The bookkeeping behind the serve routes, as the app calls it."""

    temperature: float  # what requests sample at: the trainer's (model.temperature)

    async def available(self) -> None:
        """Raise ``APIError`` 503 once training has stopped (failed or finished)."""

    async def record(self, response_id: str, experiences: List[Experience]) -> None:
        """Keep a reply's choices (exact tokens, logprobs) before the client sees it."""

    async def feedback(
        self, msg_ids: List[str], reward: float, task_id: Optional[str], run_id: int
    ) -> Dict[str, Any]:
        """Set the reward of every choice of the replies ``msg_ids``."""

    async def commit(self, task_id: Optional[str]) -> Dict[str, Any]:
        """Write the rewarded, uncommitted replies as one explore step."""

    async def metrics(self) -> Dict[str, Any]:
        """Counts of served, rewarded and committed choices, upstream's metric names."""


def sample_at_training_temperature(hooks: Optional[ServeHooks], body: Any) -> None:
    """Give an unset ``temperature`` the trainer's; refuse another (400): the trainer
    recomputes each token's logprob at its own temperature, so a reply sampled at another
    would be trained on with logprobs that do not describe how it was sampled."""
    if hooks is None:
        return
    if body.temperature is None:
        body.temperature = hooks.temperature
    elif body.temperature != hooks.temperature:
        raise APIError(
            400,
            f"temperature {body.temperature:g}: this server trains on what it serves at "
            f"temperature {hooks.temperature:g} (model.temperature), the one the trainer "
            "scores replies with; omit temperature or send that value",
            "temperature",
        )


async def _json_body(request: Request) -> Dict[str, Any]:
    """The request's JSON object; an empty body is ``{}``."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to read
        raise APIError(400, f"the body is not JSON: {str(exc) or type(exc).__name__}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    return body


def feedback_fields(body: Dict[str, Any]) -> Tuple[List[str], float, Optional[str], int]:
    """``(msg_ids, reward, task_id, run_id)`` of a ``/feedback`` body; 422 naming the field
    that is missing or of the wrong kind."""
    reward = body.get("reward")
    # bool is an int in Python, not a number in JSON; NaN and infinities cannot be trained on
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise APIError(422, f"reward must be a number, got {json.dumps(reward)}", "reward")
    if not math.isfinite(reward):
        raise APIError(422, f"reward must be a finite number, got {reward}", "reward")
    ids = body.get("msg_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise APIError(
            422,
            f"msg_ids must be a non-empty list of reply ids (the `id` of each chat "
            f"completion), got {json.dumps(ids)}",
            "msg_ids",
        )
    run_id = body.get("run_id", 0)
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise APIError(422, f"run_id must be an integer, got {json.dumps(run_id)}", "run_id")
    return ids, float(reward), task_id_of(body), run_id


def task_id_of(body: Dict[str, Any]) -> Optional[str]:
    """A body's optional ``task_id`` as a string (a number is taken as its text); 422 for
    anything else."""
    task_id = body.get("task_id")
    if task_id is None or isinstance(task_id, str):
        return task_id
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        return str(task_id)
    raise APIError(422, f"task_id must be a string, got {json.dumps(task_id)}", "task_id")


def add_serve_routes(app: FastAPI, hooks: ServeHooks, model: Any) -> None:
    """``/feedback``, ``/commit``, ``/metrics`` and ``/health`` on ``app``, which serves
    ``model`` (an ``InferenceModel``: its ``model_version`` is the served weights')."""

    @app.post("/feedback")
    async def feedback(request: Request) -> Dict[str, Any]:
        await hooks.available()
        ids, reward, task_id, run_id = feedback_fields(await _json_body(request))
        return await hooks.feedback(ids, reward, task_id, run_id)

    @app.post("/commit")
    async def commit(request: Request) -> Dict[str, Any]:
        await hooks.available()
        return await hooks.commit(task_id_of(await _json_body(request)))

    @app.get("/metrics")
    async def metrics() -> Dict[str, Any]:
        version = await model.model_version()
        return {**await hooks.metrics(), "rollout/model_0/model_version": version}

    @app.get("/health")
    async def health() -> Dict[str, str]:
        return {"status": "ok"}
