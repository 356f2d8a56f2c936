"""One local model served over the OpenAI-compatible API, in a process of its own.

A run can then use it as an external model (``engine_type: external`` with
``OPENAI_BASE_URL`` set to the printed URL), e.g. a judge shared by several runs::

    python -c "from trinity.engine.standalone import serve; serve('path/to/model')"

The served model name is ``model_path`` as given (its folder's basename is accepted too), as
for the engines a run starts itself. It guards requests as a run's servers do
(``explorer.api_server``'s defaults): with ``TRINITY_API_KEY`` set (or the variable
``api_key_env`` names) every route requires that key, which a host beyond loopback must have;
a run using it as an external model sends it from the variable ``api_key_env`` names there.
"""

from __future__ import annotations

import asyncio
from typing import Optional

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.engine.server import RunningServer, build_app
from trinity.engine.transformers_model import TransformersInferenceModel
from trinity.utils.access import is_loopback, read_secret


async def _serve_forever(
    model: TransformersInferenceModel, name: str, host: str, port: int, api_key_env: str
):
    limits, key = APIServerConfig(api_key_env=api_key_env), read_secret(api_key_env)
    app = build_app(model.served_model(name), limits=limits, api_key=key)
    server = RunningServer(app, host, port, limits.read_timeout)
    # The first line a parent process reads: where to point OPENAI_BASE_URL.
    print(f"{server.url}/v1", flush=True)
    await server.task


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_model_len: int = 2048,
    max_response_tokens: int = 256,
    chat_template: Optional[str] = None,
    api_key_env: str = "TRINITY_API_KEY",
) -> None:
    """Serve ``model_path`` on ``host:port`` (port 0: a free one) until the process is
    stopped; prints the API's base URL (``http://host:port/v1``) on one line first. A host
    beyond loopback without the key in ``api_key_env`` is refused before the model loads."""
    if read_secret(api_key_env) is None and not is_loopback(host):
        raise ValueError(
            f"host {host}: a server reachable beyond this machine needs an API key, and "
            f"{api_key_env} is not set; export {api_key_env}=<a secret>, or serve on 127.0.0.1"
        )
    model = TransformersInferenceModel(
        model_path=model_path,
        max_model_len=max_model_len,
        max_prompt_tokens=None,
        max_response_tokens=max_response_tokens,
        chat_template=chat_template,
    )
    asyncio.run(_serve_forever(model, model_path, host, port, api_key_env))
