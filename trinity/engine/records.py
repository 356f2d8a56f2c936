"""Replies kept on the server for a caller that cannot read them itself (``RECORD_HEADER``).

A recording client (``trinity.common.models.client``) reads the token data of each reply
it receives. A program that calls the server through a relay of its own (an agent harness
behind verifiers' interception proxy, a subprocess with its own HTTP client) gives the
workflow no reply to read; such calls carry ``RECORD_HEADER: <key>`` instead, the server
keeps each reply's token data under the key, and the workflow takes them afterwards
(``POST /trinity/records/take``, ``ModelWrapper.take_recorded``) in the order the replies were
made. A key is forgotten when taken; the store holds at most ``MAX_KEYS`` keys and drops the
oldest beyond that (a caller that never came back), with a warning.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Dict, List

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

logger = logging.getLogger(__name__)

MAX_KEYS = 4096


class RecordStore:
    """Replies with token data, by the record key their requests carried."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._replies: OrderedDict[str, List[Dict[str, Any]]] = OrderedDict()

    def add(self, key: str, reply: Dict[str, Any]) -> None:
        """Keep ``reply`` (a reply body with its ``"trinity"`` token data) under ``key``."""
        self._replies.setdefault(key, []).append(reply)
        self._replies.move_to_end(key)
        while len(self._replies) > self.max_keys:
            dropped, replies = self._replies.popitem(last=False)
            logger.warning(
                "recorded replies of key %s dropped untaken (%d replies): more than %d keys "
                "are waiting to be taken",
                dropped,
                len(replies),
                self.max_keys,
            )

    def take(self, key: str) -> List[Dict[str, Any]]:
        """The replies kept under ``key``, oldest first; the key is forgotten."""
        return self._replies.pop(key, [])


class TakeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    key: str


def add_record_routes(app: FastAPI, store: RecordStore) -> None:
    """``POST /trinity/records/take`` ``{"key"}`` -> ``{"replies": [...]}``."""

    @app.post("/trinity/records/take")
    async def take(body: TakeRequest) -> Dict[str, Any]:
        return {"replies": store.take(body.key)}
