"""The OpenAI-compatible servers a stage binds (mode serve's endpoint, the rollout model's
API, auxiliary models' APIs), checked before anything starts: one bound beyond loopback
needs the API key that ``explorer.api_server.api_key_env`` names (design decision 19).

The key is read from this process's environment: the launcher passes the variable on to the
explorer, wherever it runs.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from trinity.engine import DEFAULT_ENGINE, ENGINES
from trinity.utils.access import is_loopback, read_secret

# Modes whose explorer starts engines (and so their servers); mode serve binds its own.
_EXPLORING = ("both", "colocate", "explore", "bench")


def _hosted(served: Any) -> bool:
    """Whether ``served`` runs in an engine here (an external API binds nothing)."""
    try:
        return ENGINES.get(served.engine_type or DEFAULT_ENGINE).hosted
    except KeyError:  # an unknown engine name is reported by the name checks
        return False


def bound_servers(config: Any) -> List[Tuple[str, str]]:
    """(YAML key of the address, address) of each server the stage binds."""
    explorer = config.explorer
    if config.mode == "serve":
        return [("explorer.listen_address", explorer.listen_address)]
    if config.mode not in _EXPLORING:
        return []
    found = []
    rollout = explorer.rollout_model
    if rollout.enable_openai_api and _hosted(rollout):
        found.append(("explorer.rollout_model.openai_api_host", rollout.openai_api_host))
    for i, auxiliary in enumerate(explorer.auxiliary_models):
        if _hosted(auxiliary):  # always served: workflows reach them through the API only
            found.append(
                (f"explorer.auxiliary_models[{i}].openai_api_host", auxiliary.openai_api_host)
            )
    return found


def api_key_problems(config: Any) -> List[str]:
    """One line per server bound beyond loopback while no API key is set."""
    env = config.explorer.api_server.api_key_env
    if read_secret(env) is not None:
        return []
    return [
        f"{key} = {host}: a server reachable beyond this machine needs an API key, and "
        f"{env} (explorer.api_server.api_key_env) is not set; export {env}=<a secret, e.g. "
        f"from `openssl rand -hex 32`> (clients send `Authorization: Bearer <secret>`), or "
        "listen on 127.0.0.1"
        for key, host in bound_servers(config)
        if not is_loopback(host)
    ]
