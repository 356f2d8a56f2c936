"""``trinity studio``: a local web page that builds a config from the config schema."""

from __future__ import annotations

import errno
import socket
from typing import Callable, Optional

# How many ports above a busy one are tried for a free one to suggest.
PORTS_TO_SUGGEST = 20


def serve(
    host: str,
    port: int,
    config_path: Optional[str] = None,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve the studio until interrupted (uvicorn; 127.0.0.1 by default: loopback unless asked).

    The app is built before the server listens: it checks the opening config once, which
    loads what the checks read (transformers, datasets: seconds), so the page's first paint
    does not wait for that. ``announce`` gets the page's address once it is about to serve.
    """
    import uvicorn

    from trinity.studio.app import create_app

    app = create_app(config_path)
    announce(f"Trinity-RFT studio: http://{host}:{port}/  (Ctrl+C to stop)")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def port_problem(host: str, port: int) -> Optional[str]:
    """Why the studio cannot listen on ``host:port`` (None when it can), found by binding
    there as uvicorn does, so a busy port is named before anything starts."""
    try:
        _bind(host, port)
    except socket.gaierror as exc:
        return f"--host {host}: not an address to listen on ({exc.strerror})"
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return f"cannot listen on {host}:{port} ({exc.strerror}); pass --host or --port"
        free = next((p for p in range(port + 1, port + 1 + PORTS_TO_SUGGEST) if _free(host, p)), 0)
        suggestion = f", e.g. --port {free}" if free else ""
        return f"port {port} is in use on {host}; pass --port with a free port{suggestion}"
    return None


def _bind(host: str, port: int) -> None:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        # as uvicorn binds: a port left in TIME_WAIT by a stopped server is free to it
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)


def _free(host: str, port: int) -> bool:
    try:
        _bind(host, port)
    except OSError:
        return False
    return True
