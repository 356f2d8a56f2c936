"""How the service refuses: the SDK's own error shape, naming the field or the call.

Every refusal, whether an HTTP answer or a failed future, carries the body of the SDK's
``RequestFailedResponse``: ``{"error": <message>, "category": "user" | "server"}``. The SDK
raises it as ``APIStatusError`` (HTTP) or ``RequestFailedError`` (a future), message and all.

Status codes are chosen for the SDK's retry rules: it retries 408, 409, 429 and 5xx (for
minutes), so a request that will never succeed is a 400, 404 or 410, and only a failure of
the server itself is a 5xx.
"""

from __future__ import annotations

from typing import Any, Dict, Optional


class TinkerError(Exception):
    """A refused request: HTTP ``status``, the message, and the field it is about."""

    def __init__(
        self, status: int, message: str, field: Optional[str] = None, category: str = "user"
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.category = status, message, field, category

    def body(self) -> Dict[str, Any]:
        """The SDK's ``RequestFailedResponse``."""
        return {"error": self.message, "category": self.category}


def bad_field(field: str, why: str) -> TinkerError:
    """A 400 whose message starts with the field's path, as every 4xx here does."""
    return TinkerError(400, f"{field}: {why}", field)


def not_found(field: str, value: str, what: str) -> TinkerError:
    """A 404 for an id this server does not hold."""
    return TinkerError(404, f"{field}: no {what} '{value}' on this server", field)


# SDK calls whose routes this server knows but does not implement, and why; each answers a
# 404 naming the call (never a 5xx: the SDK would retry it for minutes).
NOT_IMPLEMENTED: Dict[str, str] = {
    "POST /api/v1/auth/token": "JWT exchange; this server takes the API key itself "
    "(client config pjwt_auth_enabled: false)",
    "POST /api/v1/create_custom_loss": "server-side custom losses; forward_backward_custom "
    "runs the loss client-side here (client config custom_loss_server_side: false)",
    "POST /api/v1/cancel_future": "sampling cancellation (dynamic config "
    "sample_cancel_enabled: false)",
    "POST /api/v1/retrieve_futures": "the session futures poller (client config "
    "sample_use_retrieve_futures: false)",
    "POST /api/v1/copy_weights": "copying weights between projects",
    "POST /api/v1/save_weights_external": "external weight storage",
    "GET /api/v1/training_runs": "listing every training run of an account",
    "GET /api/v1/checkpoints": "listing every checkpoint of an account",
    "GET /api/v1/sessions": "listing every session of an account",
    "POST /api/v1/sessions/search": "searching sessions",
    "GET /api/v1/whoami": "accounts",
    "GET /api/v1/audit": "audit logs",
    "GET /api/v1/billing/usage/events": "billing",
    "GET /api/v1/billing/usage/checkpoints/current": "billing",
}


def not_implemented(call: str, why: str) -> TinkerError:
    return TinkerError(
        404, f"{call} is not implemented by trinity tinker-serve ({why})", category="user"
    )
