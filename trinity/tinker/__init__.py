"""A Tinker-compatible service over this project's trainer and engines (``trinity
tinker-serve``): the HTTP API the official ``tinker`` SDK calls, so its scripts and
tinker-cookbook's recipes train LoRA adapters on this machine.

Public entry points:

- ``TinkerServer(ServeOptions(base_model=...))``: the whole service, listening (``.url``,
  ``.close()``); what the CLI and the tests start.
- ``build_app(service, limits, api_key)``: the ASGI app over a ``TinkerService``.
- ``client_config(limits)``: the feature flags it answers the SDK with.

Layout: ``routes.py`` (HTTP), ``wire.py`` (JSON bodies), ``proto_codec.py`` (protobuf),
``service.py``, ``training.py`` and ``sampling.py`` (what each call does), ``worker.py``
(the model thread), ``futures.py``, ``sessions.py``, ``lora_models.py`` (adapters over one
base model), ``sampler.py`` (the engine), ``checkpoints.py`` (tinker:// paths), ``losses/``.
Needs the ``tinker`` extra (the SDK's protobuf definitions).
"""

import importlib
from typing import Any

# Public names and their modules, imported on first use: the losses and other pure parts
# import without the SDK; the service needs it (its protobuf messages).
_PUBLIC = {
    "ServeOptions": "trinity.tinker.serve",
    "TinkerServer": "trinity.tinker.serve",
    "TinkerService": "trinity.tinker.service",
    "build_app": "trinity.tinker.routes",
    "client_config": "trinity.tinker.routes",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'trinity.tinker' has no attribute '{name}'")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
