"""``trinity studio``: a local web page that builds a config from the config schema."""

from __future__ import annotations

from typing import Optional


def serve(host: str, port: int, config_path: Optional[str] = None) -> None:
    """Serve the studio until interrupted (uvicorn; 127.0.0.1 by default: loopback unless asked)."""
    import uvicorn

    from trinity.studio.app import create_app

    uvicorn.run(create_app(config_path), host=host, port=port, log_level="warning")
