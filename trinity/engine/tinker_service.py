"""The Tinker service as this project's trainer and engine reach it, through the official SDK.

Where: ``TINKER_BASE_URL`` and ``TINKER_API_KEY``, read as the SDK reads them (``service_url``).
The SDK retries a request that gets no answer for minutes, and waits on a pending result with
no bound at all; a run must fail instead, naming the service, and the next run resume from its
checkpoint. So before a client is made the service is asked for its capabilities with a few
bounded attempts (``capabilities``), and every result is awaited in slices: after each slice
without an answer the service is asked again, and one that does not answer within the
bounded attempts ends the wait with ``TinkerUnavailable`` (``wait_result``). A service that
answers but is slow (a queue) is waited for as long as it keeps answering.

The probe speaks the documented REST call ``GET /api/v1/get_server_capabilities`` with the
SDK's ``X-API-Key`` header, and before start ``sdk_problem`` sends the SDK's first call of a
session (``POST /api/v1/client/config``), which a service written for an older SDK lacks
(httpx: the SDK itself imports torch, seconds that a config check should not cost);
everything else goes through the SDK. ``tinker`` is imported on use only: naming the
engine must not load it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from typing import Any, Dict, List, Optional

URL_ENV = "TINKER_BASE_URL"
KEY_ENV = "TINKER_API_KEY"
# The SDK's own default when TINKER_BASE_URL is unset (tinker/lib/base_url.py).
DEFAULT_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"
CAPABILITIES_PATH = "/api/v1/get_server_capabilities"
CLIENT_CONFIG_PATH = "/api/v1/client/config"  # the SDK's first call of a session

PROBE_ATTEMPTS = 4  # bounded retries of a service that does not answer
PROBE_TIMEOUT_S = 10.0  # one attempt's connect + read time
PROBE_BACKOFF_S = (1.0, 2.0, 4.0)  # the pauses between attempts
WAIT_SLICE_S = 60.0  # a pending result is awaited this long before the service is asked again


class TinkerUnavailable(RuntimeError):
    """The Tinker service did not answer within the bounded attempts."""


def service_url() -> str:
    """The service's base URL as the SDK resolves it: ``TINKER_BASE_URL``, else its default."""
    return (os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def service_env() -> Dict[str, str]:
    """The set ``TINKER_*`` variables the SDK reads, to hand to the run's Ray workers (a
    worker of a cluster started before this shell set them would not see them)."""
    return {name: os.environ[name] for name in (URL_ENV, KEY_ENV) if os.environ.get(name)}


def probe(url: Optional[str] = None, attempts: int = PROBE_ATTEMPTS) -> Dict[str, Any]:
    """The service's capabilities (``{"supported_models": [...]}``), asked ``attempts`` times
    at most; raises ``TinkerUnavailable`` naming the URL when none was answered, and
    ``PermissionError`` when the service refused the key."""
    import httpx

    url = url or service_url()
    headers = {"X-API-Key": os.environ.get(KEY_ENV, "")}
    errors: List[str] = []
    for attempt in range(attempts):
        if attempt:
            time.sleep(PROBE_BACKOFF_S[min(attempt - 1, len(PROBE_BACKOFF_S) - 1)])
        try:
            reply = httpx.get(url + CAPABILITIES_PATH, headers=headers, timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:  # refused, reset, timed out: the service did not answer
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        if reply.status_code in (401, 403):
            raise PermissionError(
                f"the Tinker service at {url} refused the API key in {KEY_ENV} "
                f"(HTTP {reply.status_code}): {reply.text[:200]}"
            )
        if reply.status_code >= 500 or reply.status_code in (408, 429):
            errors.append(f"HTTP {reply.status_code}")
            continue
        reply.raise_for_status()
        return reply.json()
    raise TinkerUnavailable(
        f"the Tinker service at {url} ({URL_ENV}) did not answer {attempts} attempts over "
        f"{sum(PROBE_BACKOFF_S[: attempts - 1]):g}s (last: {errors[-1]})"
    )


def sdk_problem(url: Optional[str] = None) -> Optional[str]:
    """A line when the service does not take the SDK's first call of a session (``POST
    /api/v1/client/config`` with the SDK's version, as ``tinker`` sends it before any other):
    a service written for another SDK version answers 404, and no client can start."""
    import httpx

    url = url or service_url()
    version = _sdk_version()
    reply = httpx.post(
        url + CLIENT_CONFIG_PATH,
        json={"sdk_version": version},
        headers={"X-API-Key": os.environ.get(KEY_ENV, "")},
        timeout=PROBE_TIMEOUT_S,
    )
    if reply.status_code < 400:
        return None
    return (
        f"the Tinker service at {url} answered HTTP {reply.status_code} to POST "
        f"{CLIENT_CONFIG_PATH}, the first call of a session of the installed SDK (tinker "
        f"{version}): it does not speak this SDK version's API; install the SDK version the "
        "service was written for, or use a service that takes this one"
    )


def _sdk_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tinker")
    except PackageNotFoundError:
        return "not installed"


def model_names(capabilities: Dict[str, Any]) -> List[str]:
    """The base models a capabilities answer lists."""
    return [m.get("model_name") for m in capabilities.get("supported_models") or []]


def base_model_problem(capabilities: Dict[str, Any], base_model: str, key: str) -> Optional[str]:
    """A line when the service does not list ``base_model`` (configured at ``key``)."""
    names = [name for name in model_names(capabilities) if name]
    if base_model in names:
        return None
    return (
        f"{key} = {base_model}: the Tinker service at {service_url()} does not hold this base "
        f"model (it lists: {', '.join(names) or 'none'}); name one of those"
    )


def service_client() -> Any:
    """A ``tinker.ServiceClient`` of the service, made once the service answered ``probe``
    (the SDK's own first requests would retry a silent service for minutes)."""
    probe()
    import tinker

    return tinker.ServiceClient()


def wait_result(future: Any, what: str) -> Any:
    """The result of an SDK future (``APIFuture``), awaited in slices of ``WAIT_SLICE_S``
    with the service probed between them; ``what`` names the call in the error."""
    while True:
        try:
            return future.result(timeout=WAIT_SLICE_S)
        except (TimeoutError, concurrent.futures.TimeoutError):
            _still_there(what)


async def await_result(future: Any, what: str) -> Any:
    """``wait_result`` on an event loop (the engine's): the loop keeps serving meanwhile."""
    pending = asyncio.wrap_future(future.future())
    while True:
        try:
            return await asyncio.wait_for(asyncio.shield(pending), WAIT_SLICE_S)
        except asyncio.TimeoutError:
            await asyncio.to_thread(_still_there, what)


def _still_there(what: str) -> None:
    try:
        probe()
    except TinkerUnavailable as exc:
        raise TinkerUnavailable(
            f"{what}: {exc}; the run stops here and keeps its checkpoints: run it again once "
            "the service answers, and it resumes from the last one"
        ) from None
