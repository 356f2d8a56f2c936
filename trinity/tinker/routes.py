"""The HTTP routes of the Tinker API, as the official SDK calls them (``/api/v1/...``).

``build_app`` makes the FastAPI app over a ``TinkerService``, behind the project's
``Guard`` (API key in ``X-API-Key``, body size, time and in-flight limits). JSON bodies are
read by ``wire.parse``; ``forward_backward`` takes protobuf; ``retrieve_future`` answers
protobuf for ``ForwardBackwardOutput`` and ``SampleResponse`` results, JSON otherwise.

Every refusal is the SDK's error body (``errors.py``); a route this server does not have is
a 404 naming the call, with the reason where the SDK has that call (``NOT_IMPLEMENTED``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Optional, Type

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.engine.guard import Dialect, Guard
from trinity.engine.openai_protocol import APIError
from trinity.tinker import sampling, training, wire
from trinity.tinker.errors import NOT_IMPLEMENTED, TinkerError, not_implemented
from trinity.tinker.proto_codec import PROTOBUF, SampleResult, forward_backward_proto, sample_proto
from trinity.tinker.service import TinkerService
from trinity.utils.access import Secret

API = "/api/v1"


def _render(error: APIError) -> Dict[str, Any]:
    return {"error": error.message, "category": "server" if error.status >= 500 else "user"}


# The Guard's refusals in the SDK's shape, naming the tinker-serve options that set limits.
TINKER = Dialect(
    key_header=b"x-api-key",
    bearer=False,
    send_key="`X-API-Key: <key>` (the SDK's api_key, or TINKER_API_KEY)",
    render=_render,
    settings="tinker-serve's {} option",
)


def _json(content: Any, status: int = 200) -> Response:
    return Response(json.dumps(content), status, media_type="application/json")


def _error(exc: TinkerError) -> Response:
    return _json(exc.body(), exc.status)


def build_app(
    service: TinkerService, limits: APIServerConfig, api_key: Optional[Secret]
) -> FastAPI:
    """The app; see the module docstring."""
    app = FastAPI(
        title="Trinity-RFT Tinker service", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(Guard, limits=limits, api_key=api_key, dialect=TINKER)
    _add_error_handlers(app)
    _add_service_routes(app, service, limits)
    _add_model_routes(app, service)
    _add_sampling_routes(app, service)
    for call, why in NOT_IMPLEMENTED.items():
        method, path = call.split(" ", 1)
        app.add_api_route(path, _refuse(call, why), methods=[method])
    return app


def _refuse(call: str, why: str) -> Callable:
    async def refuse() -> Response:
        return _error(not_implemented(call, why))

    return refuse


def _post(app: FastAPI, path: str, body: Type[wire.Body], call: Callable[[Any], Any]) -> None:
    """A JSON route: the body read as ``body``, the answer what ``call`` returns."""

    async def route(request: Request) -> Response:
        result = call(wire.parse(body, await request.body()))
        return _json(result)

    app.add_api_route(API + path, route, methods=["POST"])


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TinkerError)
    async def _refused(request: Request, exc: TinkerError) -> Response:
        return _error(exc)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        call = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            return _error(not_implemented(call, "not a call of the Tinker API this server serves"))
        return _error(TinkerError(exc.status_code, f"{call}: {exc.detail}"))


def _add_service_routes(app: FastAPI, service: TinkerService, limits: APIServerConfig) -> None:
    config = client_config(limits)

    @app.get(API + "/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get(API + "/get_server_capabilities")
    async def capabilities() -> Response:
        return _json(service.capabilities())

    @app.post(API + "/client/config")
    async def client_config_route() -> Response:
        return _json(config)

    @app.post(API + "/client/dynamic_config")
    async def dynamic_config() -> Response:
        return _json({"refresh_interval_sec": 3600, "sample_cancel_enabled": False})

    @app.post(API + "/telemetry")
    async def telemetry() -> Response:  # the SDK's own telemetry: accepted, not kept
        return _json({"status": "accepted"})

    _post(app, "/create_session", wire.CreateSession, service.create_session)
    _post(app, "/session_heartbeat", wire.SessionRef, service.heartbeat)

    @app.post(API + "/sessions/{session_id}/finish")
    async def finish(session_id: str) -> Response:
        service.finish_session(session_id)
        return _json(None)

    @app.get(API + "/sessions/{session_id}")
    async def get_session(session_id: str) -> Response:
        return _json(service.get_session(session_id))

    @app.post(API + "/retrieve_future")
    async def retrieve(request: Request) -> Response:
        body = wire.parse(wire.RetrieveFuture, await request.body())
        return await retrieve_future(service, body)


def _add_model_routes(app: FastAPI, service: TinkerService) -> None:
    _post(app, "/create_model", wire.CreateModel, service.create_model)
    _post(app, "/get_info", wire.ModelRef, service.get_info)
    _post(app, "/unload_model", wire.ModelRef, service.unload_model)
    _post(app, "/optim_step", wire.OptimStep, lambda b: training.optim_step(service, b))
    _post(app, "/save_weights", wire.SaveWeights, lambda b: training.save_weights(service, b))
    _post(
        app,
        "/save_weights_for_sampler",
        wire.SaveWeights,
        lambda b: training.save_weights_for_sampler(service, b),
    )
    _post(app, "/load_weights", wire.LoadWeights, lambda b: training.load_weights(service, b))
    _post(app, "/weights_info", wire.WeightsInfo, service.weights_info)

    @app.post(API + "/forward_backward")
    async def forward_backward(request: Request) -> Response:
        headers = request.headers
        content_type = headers.get("content-type", "")
        encoding = headers.get("content-encoding", "").lower()
        body = await request.body()
        return _json(training.forward_backward(service, body, content_type, encoding))

    @app.get(API + "/training_runs/{run_id}")
    async def training_run(run_id: str) -> Response:
        return _json(service.training_run(run_id))

    @app.get(API + "/training_runs/{run_id}/checkpoints")
    async def checkpoints(run_id: str) -> Response:
        service.training_run(run_id)  # a 404 for a run this server never had
        return _json({"checkpoints": service.store.listing(run_id), "cursor": None})


def _add_sampling_routes(app: FastAPI, service: TinkerService) -> None:
    _post(
        app, "/create_sampling_session", wire.CreateSamplingSession, service.create_sampling_session
    )
    _post(app, "/join_sampling_session", wire.SamplingSessionRef, service.join_sampling_session)
    _post(app, "/asample", wire.Sample, lambda b: sampling.asample(service, b))

    @app.get(API + "/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> Response:
        return _json(service.get_sampler(sampler_id))


def client_config(limits: APIServerConfig) -> Dict[str, Any]:
    """The feature flags the SDK asks for before anything else: a plain API key (no JWT
    exchange), protobuf forward_backward without compression, chunks that fit the body
    limit, per-request future polling, and custom losses run client-side."""
    return {
        "pjwt_auth_enabled": False,
        "credential_default_source": "api_key",
        "use_pyqwest_transport": False,
        "parallel_fwdbwd_chunks": True,
        "proto_compress_fwdbwd": False,
        "fwdbwd_max_chunk_bytes_count": max(1024, limits.max_body_bytes // 2),
        "sample_max_concurrent_requests": max(1, limits.max_in_flight // 2),
        "sample_use_retrieve_futures": False,
        "custom_loss_server_side": False,
        "sample_join_sampling_session": False,
    }


async def retrieve_future(service: TinkerService, body: wire.RetrieveFuture) -> Response:
    """``POST /api/v1/retrieve_future``: the result once done (waiting a while for it),
    ``try_again`` while it runs, or the failure in the SDK's shape."""
    future = await service.futures.wait(body.request_id)
    if future is None:
        return _json({"type": "try_again", "request_id": body.request_id, "queue_state": "active"})
    if future.error is not None:
        return _json(future.error.body())
    result = future.result
    if isinstance(result, training.ForwardBackwardResult):
        return Response(forward_backward_proto(result.outputs, result.metrics), media_type=PROTOBUF)
    if isinstance(result, SampleResult):
        return Response(sample_proto(result), media_type=PROTOBUF)
    return _json(result)


__all__ = ["JSONResponse", "TINKER", "build_app", "client_config"]
