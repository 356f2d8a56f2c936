"""Who may call a server: API keys that never print, and which addresses stay on this machine.

An OpenAI-compatible server bound beyond loopback must check an API key; the key is read
from an environment variable (the config holds only the variable's name) and travels inside
a ``Secret``, whose ``repr`` and ``str`` hide it, so a logged dict or an error message that
shows where a server listens never shows its key.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Dict, Optional

# Host names that always mean this machine; other names may resolve to any address.
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


class Secret:
    """A string that prints as ``Secret(****)``; ``reveal()`` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(****)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple:
        # Ray and multiprocessing pickle it; the pickle holds the value, never a log line.
        return (Secret, (self._value,))


def read_secret(env_name: Optional[str]) -> Optional[Secret]:
    """The value of the environment variable ``env_name`` as a ``Secret``; None when the
    name is empty or the variable is unset or empty."""
    value = os.environ.get(env_name) if env_name else None
    return Secret(value) if value else None


def passed_on(env_name: Optional[str]) -> Dict[str, str]:
    """``{env_name: value}`` when that variable is set here, else empty: what a launcher
    hands to a process it starts elsewhere (a Ray worker does not share its environment)."""
    value = os.environ.get(env_name) if env_name else None
    return {env_name: value} if value else {}


def is_loopback(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from this machine only: a loopback
    address (127.0.0.0/8, ::1) or ``localhost``. Wildcards (0.0.0.0, ::) and every other
    address or name are not."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False
