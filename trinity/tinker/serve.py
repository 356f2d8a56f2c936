"""``trinity tinker-serve``: the service, its engines and its HTTP server, in one process.

``TinkerServer(options)`` loads the base model twice (the trainer's copy, which carries the
adapters, and the sampling engine's), builds the service and serves it on an event loop of
its own thread; ``url`` is where it listens, ``close()`` stops it. The CLI keeps it running
until interrupted; tests start it the same way on 127.0.0.1.

Like every server of this project it listens on 127.0.0.1 unless told otherwise, and
beyond loopback it requires an API key (``api_key_env``). The SDK sends its key in
``X-API-Key`` and insists that it starts with ``tml-``, so a key set here must too; on
loopback without a key set, any ``tml-`` key a client sends is accepted.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.engine.hf_engine import TransformersEngine
from trinity.engine.server import RunningServer
from trinity.tinker.checkpoints import CheckpointStore
from trinity.tinker.futures import FutureStore
from trinity.tinker.lora_models import LoraTrainer
from trinity.tinker.routes import build_app
from trinity.tinker.sampler import Sampler
from trinity.tinker.service import Served, TinkerService
from trinity.utils import openmp
from trinity.utils.access import Secret, is_loopback, read_secret
from trinity.utils.device import cpu_supports
from trinity.utils.loop_host import LoopHost

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ServeOptions:
    """What ``trinity tinker-serve`` takes (its options, one for one)."""

    base_model: str  # a local folder or a hub id
    model_name: Optional[str] = None  # the name clients use; unset: base_model as given
    host: str = "127.0.0.1"
    port: int = 8000
    state_dir: str = "./tinker-state"
    device: Optional[str] = None  # unset: cuda when there is one, else cpu
    dtype: str = "float32"
    max_model_len: Optional[int] = None  # unset: the model's max_position_embeddings
    max_samples: int = 64  # num_samples of one sampling request, at most
    seed: int = 0  # the sampling engine's generator (requests may set their own seed)
    api_key_env: str = "TINKER_API_KEY"
    max_body_bytes: int = 64 * 1024 * 1024
    max_in_flight: int = 1024
    read_timeout: float = 60.0


def resolve_base_model(value: str) -> str:
    """The local folder of ``--base-model`` (a folder, or a hub id read through the hub's
    cache); ``ValueError`` with the next step otherwise."""
    from trinity.utils.hub import HubError, hub_ref, resolve

    if os.path.isdir(os.path.expanduser(value)):
        return os.path.abspath(os.path.expanduser(value))
    ref = hub_ref(value, "model")
    if ref is None:
        raise ValueError(f"--base-model {value}: no such folder, and not a hub id")
    try:
        return resolve("--base-model", value, ref, download=True, what="model")
    except HubError as exc:
        raise ValueError(str(exc)) from None


def api_key(options: ServeOptions) -> Optional[Secret]:
    """The key clients must send: required beyond loopback, and a ``tml-`` key (the SDK
    sends no other)."""
    key = read_secret(options.api_key_env)
    if key is None and not is_loopback(options.host):
        raise ValueError(
            f"--host {options.host} is reachable from other machines: set an API key in "
            f"{options.api_key_env} (--api-key-env), e.g. tml-<random>, or listen on 127.0.0.1"
        )
    if key is not None and not key.reveal().startswith("tml-"):
        raise ValueError(
            f"{options.api_key_env} must start with 'tml-': the Tinker SDK sends no other key"
        )
    return key


class TinkerServer:
    """The running service; see the module docstring."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        key = api_key(options)
        path = resolve_base_model(options.base_model)
        self.service = build_service(options, path)
        # Loading ran torch on this thread, whose OpenMP pool would now idle beside the
        # worker's and slow every barrier of its ops (utils/openmp.py): free it.
        openmp.share_cores(True)
        openmp.release_workers()
        limits = APIServerConfig(
            api_key_env=options.api_key_env,
            max_body_bytes=options.max_body_bytes,
            max_in_flight=options.max_in_flight,
            read_timeout=options.read_timeout,
        )
        app = build_app(self.service, limits, key)
        self.host = LoopHost(lambda: None, "tinker-serve")
        self.server: RunningServer = self.host.run(self._start(app, limits))
        required = " (API key required)" if key is not None else ""
        logger.info("Tinker API of %s at %s%s", self.service.served.name, self.url, required)

    async def _start(self, app: Any, limits: APIServerConfig) -> RunningServer:
        return RunningServer(app, self.options.host, self.options.port, limits.read_timeout)

    @property
    def url(self) -> str:
        return self.server.url

    def wait(self) -> None:
        """Block until the HTTP server stops (Ctrl-C)."""
        self.host.run(_wait(self.server))

    def close(self) -> None:
        self.host.run(self.server.close())
        self.host.close()
        self.service.close()


async def _wait(server: RunningServer) -> None:
    await asyncio.shield(server.task)


def build_service(options: ServeOptions, path: str) -> TinkerService:
    """The trainer, the sampling engine and the service over the base model at ``path``."""
    from transformers import AutoConfig

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if options.dtype not in _DTYPES:
        raise ValueError(f"--dtype {options.dtype}: choose one of {sorted(_DTYPES)}")
    if device == "cpu" and options.dtype != "float32" and not cpu_supports(options.dtype):
        logger.warning(
            "--dtype %s: this CPU has no %s instructions (torch's oneDNN reports none), so "
            "the model computes emulated, about 100x slower than --dtype float32",
            options.dtype,
            options.dtype,
        )
    config = AutoConfig.from_pretrained(path)
    max_len = options.max_model_len or getattr(config, "max_position_embeddings", 2048)
    engine = TransformersEngine(
        path,
        dtype=options.dtype,
        device=device,
        seed=options.seed,
        max_model_len=max_len,
        max_prompt_tokens=None,
        max_response_tokens=max_len,
        min_response_tokens=0,
        enable_prompt_truncation=False,
    )
    trainer = LoraTrainer(path, device, _DTYPES[options.dtype])
    futures = FutureStore()
    name = options.model_name or options.base_model
    aliases = tuple({options.base_model, path, os.path.basename(os.path.normpath(path))} - {name})
    # a hub id (without its @revision) loads on any machine; a folder only on this one
    local = os.path.isdir(os.path.expanduser(options.base_model))
    hub_id = None if local else options.base_model.partition("@")[0]
    served = Served(name, path, aliases, max_len, hub_id or path)
    store = CheckpointStore(options.state_dir)
    return TinkerService(
        served, trainer, Sampler(engine, futures), store, futures, options.max_samples
    )
